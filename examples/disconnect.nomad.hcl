# A service that tolerates its node losing contact for up to 2 minutes: its
# allocs go "unknown" instead of "lost", and come back if the node returns.
job "sticky" {
  type = "service"

  group "cache" {
    count                 = 2
    max_client_disconnect = "2m"

    spread {
      attribute = "${node.datacenter}"
      weight    = 50
    }

    update {
      max_parallel     = 1
      min_healthy_time = "5s"
      healthy_deadline = "1m"
    }

    task "cache" {
      driver = "mock"

      config {
        run_for = "1h"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
