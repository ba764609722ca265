# The mock driver runs nothing: each task "runs" for run_for and exits with
# exit_code. Handy for scheduling experiments with many allocs.
job "mock" {
  type        = "service"
  datacenters = ["*"]

  group "web" {
    count = 3

    affinity {
      attribute = "${node.class}"
      value     = "large"
      weight    = 50
    }

    task "server" {
      driver = "mock"

      config {
        run_for   = "1h"
        exit_code = 0
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
