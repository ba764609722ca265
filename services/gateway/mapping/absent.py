"""The fields of Nomad's JSON that Corral's objects have no counterpart for,
each with the value Nomad's servers send when it is unset, by the name of
Nomad's struct. Every mapping puts them in (without overwriting a value
Corral does have), so a client finds each field Nomad's `api` package
decodes — python-nomad's callers index them, Nomad's Go client expects
their types — and Corral's own extras never reach the caller under a
Nomad name. tests/e2e/test_api_types.py checks every route's answer
against Nomad's api types; tests/apitypes/ holds those types.

Values are what Nomad's server structs hold when unset: "" for strings,
0, false, `null` for pointers, slices and maps, Go's zero time for a
`time.Time`. A feature Corral refuses on input (Vault, Consul Connect,
CSI volumes, artifacts, ...) shows here as that unset value."""

from __future__ import annotations

from typing import Any

#: Go's zero time.Time, as Nomad's JSON shows an unset one
ZERO_TIME = "0001-01-01T00:00:00Z"


ABSENT: dict[str, dict[str, Any]] = {
    "Job": {
        "ConsulNamespace": "",
        "VaultNamespace": "",
        "NomadTokenID": "",
        "DispatchIdempotencyToken": "",
        "Migrate": None,
        "Reschedule": None,
        "Payload": None,
        "UI": None,
    },
    "TaskGroup": {
        "Consul": None,
        "Volumes": None,
        "Disconnect": None,
        "MaxClientDisconnect": None,
        "StopAfterClientDisconnect": None,
        "PreventRescheduleOnLost": False,
        "MaxRunDuration": None,
    },
    "Task": {
        "Artifacts": None,
        "Consul": None,
        "CSIPluginConfig": None,
        "Kind": "",
        "Lifecycle": None,
        "LogConfig": None,
        "Schedule": None,
        "Secrets": None,
        "Templates": None,
        "Vault": None,
        "VolumeMounts": None,
    },
    "Service": {
        "CheckRestart": None,
        "Cluster": "",
        "Connect": None,
        "EnableTagOverride": False,
        "Identity": None,
        "Kind": "",
        "TaggedAddresses": None,
        "Weights": None,
    },
    "ServiceCheck": {
        "Advertise": "",
        "Args": None,
        "Command": "",
        "Expose": False,
        "FailuresBeforeCritical": 0,
        "FailuresBeforeWarning": 0,
        "GRPCService": "",
        "GRPCUseTLS": False,
        "Notes": "",
        "SuccessBeforePassing": 0,
        "TLSServerName": "",
    },
    "WorkloadIdentity": {"ExtraClaims": None, "ServiceName": ""},
    # deprecated since Nomad 1.5.4 (Disabled replaced it); Nomad's servers
    # do not send it, so Go's client holds nil
    "LogConfig": {"Enabled": None},
    "RequestedDevice": {"Affinities": None},
    "NetworkResource": {"CIDR": "", "DNS": None, "Device": "", "IP": ""},
    "Port": {"IgnoreCollision": False},
    "Resources": {"IOPS": 0, "NUMA": None, "SecretsMB": 0},
    "TaskEvent": {
        "DiskLimit": 0,
        "DiskSize": 0,
        "DownloadError": "",
        "DriverError": "",
        "DriverMessage": "",
        "FailedSibling": "",
        "GenericSource": "",
        "KillError": "",
        "KillReason": "",
        "KillTimeout": 0,
        "RestartReason": "",
        "SetupError": "",
        "StartDelay": 0,
        "TaskSignal": "",
        "TaskSignalReason": "",
        "ValidationError": "",
        "VaultError": "",
    },
    "Evaluation": {"PlanAnnotations": None, "MissingNonNodeResources": None},
    "AllocationMetric": {"ResourcesExhausted": None, "Scores": None},
    "Allocation": {"NetworkStatus": None, "SigningKeyID": ""},
    "Node": {
        "CSIControllerPlugins": None,
        "CSINodePlugins": None,
        "CgroupParent": "",
        "GCVolumesOnNodeGC": False,
        "HostNetworks": None,
        "HostVolumes": None,
        "LastDrain": None,
        "Links": None,
        "NodeMaxAllocs": 0,
        "Reserved": None,
        "Resources": None,
    },
    "DriverInfo": {"Attributes": None, "HealthDescription": "", "UpdateTime": ZERO_TIME},
    "NodePool": {"NodeIdentityTTL": ""},
    "Namespace": {"OptionalExtraClaims": None, "RequiredExtraClaims": None},
    "AgentMember": {
        "ProtocolMin": 0,
        "ProtocolMax": 0,
        "ProtocolCur": 0,
        "DelegateMin": 0,
        "DelegateMax": 0,
        "DelegateCur": 0,
    },
}


def fill(struct: str, out: dict[str, Any] | None) -> dict[str, Any] | None:
    """`out` (the Nomad JSON of a `struct`) with Nomad's fields Corral lacks
    put in at their unset values; values already there are kept."""
    if out is None:
        return None
    for key, value in ABSENT[struct].items():
        out.setdefault(key, value)
    return out


def fill_all(struct: str, items: Any) -> None:
    """`fill` each object of a list (or of a map's values); null stays null."""
    if isinstance(items, dict):
        items = list(items.values())
    for item in items or ():
        fill(struct, item)
