# A system job: one alloc on every eligible Linux node, kept running.
job "node-agent" {
  type = "system"

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  group "agent" {
    task "agent" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo \"watching $(hostname)\"; sleep 5; done"]
      }

      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
