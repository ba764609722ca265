# A long-running service: one raw_exec task printing "hello" every 2 seconds.
# raw_exec is on in `corral dev`; other agents run it only with
# `--drivers raw_exec,...` (it is off unless configured, as in Nomad).
#
#   corral job run examples/hello.nomad.hcl
#   corral job status hello
#   corral alloc logs <alloc-id>
job "hello" {
  type = "service"

  group "hello" {
    count = 1

    task "hello" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo \"hello from ${NOMAD_ALLOC_ID}\"; sleep 2; done"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
