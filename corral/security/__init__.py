"""Who may call what: certificates, TLS, dialing a role with this process's
identity, ACL policies and tokens, the access table of every RPC."""
