# A sysbatch job: run once to completion on every node.
job "inventory" {
  type = "sysbatch"

  group "inventory" {
    task "uname" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "uname -a; df -h . | tail -1"]
      }

      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
