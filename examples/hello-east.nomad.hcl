# hello in region east of a federation (docs/operations.md, Federation):
# `job run` through any region's state or gateway sends it to east, where it
# runs; its task sees NOMAD_REGION=east.
#
#   corral job run examples/hello-east.nomad.hcl
#   corral job status -region east hello-east
#   corral alloc logs -region east <alloc-id>
job "hello-east" {
  region = "east"
  type   = "service"

  group "hello" {
    count = 1

    task "hello" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo \"hello from ${NOMAD_ALLOC_ID} in ${NOMAD_REGION}\"; sleep 2; done"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
