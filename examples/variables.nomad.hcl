# Input variables, locals, functions and a dynamic block (Nomad's HCL2).
#
#   corral job run examples/variables.nomad.hcl
#   corral job run -var count=2 -var 'greetings=["hi", "hey"]' examples/variables.nomad.hcl
#   NOMAD_VAR_env=staging corral job run examples/variables.nomad.hcl
#   corral job run -var-file=my.vars.hcl examples/variables.nomad.hcl
variable "env" {
  type        = string
  default     = "dev"
  description = "The environment the greeter runs in."

  validation {
    condition     = contains(["dev", "staging", "prod"], var.env)
    error_message = "The env must be dev, staging or prod."
  }
}

variable "count" {
  type    = number
  default = 1
}

variable "greetings" {
  type    = list(string)
  default = ["hello", "bonjour"]
}

locals {
  name    = "greeter-${var.env}"
  message = join(", ", [for g in var.greetings : title(g)])
  labels  = { team = "platform", env = var.env }
}

job "greeter" {
  type = "service"
  meta = merge(local.labels, { greetings = length(var.greetings) })

  group "greeter" {
    count = var.count

    task "greet" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        # ${NOMAD_ALLOC_ID} is left for the client to fill in at run time
        args = ["-c", <<-EOT
          while true; do
            echo "${local.message} from ${local.name} (${NOMAD_ALLOC_ID})"
            sleep 5
          done
          EOT
        ]
      }

      # one constraint per entry: here, run on Linux only
      dynamic "constraint" {
        for_each = { "${attr.kernel.name}" = "linux" }
        content {
          attribute = constraint.key
          value     = constraint.value
        }
      }

      env {
        GREETER_ENV = upper(var.env)
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
