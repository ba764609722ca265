# A batch job: three short raw_exec runs that finish and stay complete.
job "batch" {
  type     = "batch"
  priority = 40

  meta {
    owner = "examples"
  }

  group "work" {
    count = 3

    restart {
      attempts = 1
      delay    = "1s"
      mode     = "fail"
    }

    reschedule {
      attempts  = 1
      interval  = "1h"
      delay     = "5s"
      unlimited = false
    }

    task "compute" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo computing $ITEM; sleep 1; echo done"]
      }

      env {
        ITEM = "${NOMAD_ALLOC_INDEX}"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
