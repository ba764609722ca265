"""The scheduler configuration as Nomad's api.SchedulerConfiguration, both ways."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb

_PREEMPTION = {
    "SystemSchedulerEnabled": "system_scheduler_enabled",
    "SysBatchSchedulerEnabled": "sysbatch_scheduler_enabled",
    "BatchSchedulerEnabled": "batch_scheduler_enabled",
    "ServiceSchedulerEnabled": "service_scheduler_enabled",
}


#: the number of feasible nodes Corral's scheduler scores for a group with
#: spreads or affinities (services/worker/scheduler/feasible/stack.py, Nomad's
#: default); Nomad shows 0 when unset and Corral's is not configurable
NODE_LIMIT_FOR_FEASIBILITY_CHECKS = 100


class ConfigInputError(ValueError):
    """A scheduler configuration body Corral cannot take; names the field."""


def scheduler_config(msg: pb.SchedulerConfiguration) -> dict[str, Any]:
    return {
        "SchedulerAlgorithm": msg.scheduler_algorithm or "binpack",
        "PreemptionConfig": {
            nomad: getattr(msg.preemption_config, ours) for nomad, ours in _PREEMPTION.items()
        },
        "MemoryOversubscriptionEnabled": msg.memory_oversubscription_enabled,
        "RejectJobRegistration": False,
        "PauseEvalBroker": msg.pause_eval_broker,
        "NodeLimitForFeasibilityChecks": 0,
        "CreateIndex": msg.create_index,
        "ModifyIndex": msg.modify_index,
    }


def _bool(data: dict[str, Any], key: str, where: str) -> bool:
    value = data.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigInputError(f"{where}{key}: expected true or false")
    return value


def scheduler_config_from_nomad(data: Any) -> pb.SchedulerConfiguration:
    if not isinstance(data, dict):
        raise ConfigInputError("expected a JSON object holding the scheduler configuration")
    if data.get("RejectJobRegistration"):
        raise ConfigInputError("RejectJobRegistration is not supported by Corral")
    limit = data.get("NodeLimitForFeasibilityChecks") or 0
    if limit not in (0, NODE_LIMIT_FOR_FEASIBILITY_CHECKS):
        n = NODE_LIMIT_FOR_FEASIBILITY_CHECKS
        raise ConfigInputError(
            f"NodeLimitForFeasibilityChecks: Corral's scheduler always scores {n} nodes "
            f"(0 or {n}); another value is not supported by Corral"
        )
    algorithm = data.get("SchedulerAlgorithm") or ""
    if not isinstance(algorithm, str):
        raise ConfigInputError("SchedulerAlgorithm: expected a string")
    cfg = pb.SchedulerConfiguration(
        scheduler_algorithm=algorithm,
        memory_oversubscription_enabled=_bool(data, "MemoryOversubscriptionEnabled", ""),
        pause_eval_broker=_bool(data, "PauseEvalBroker", ""),
    )
    pre = data.get("PreemptionConfig") or {}
    if not isinstance(pre, dict):
        raise ConfigInputError("PreemptionConfig: expected an object")
    for nomad, ours in _PREEMPTION.items():
        setattr(cfg.preemption_config, ours, _bool(pre, nomad, "PreemptionConfig."))
    cfg.preemption_config.SetInParent()
    modify = data.get("ModifyIndex") or 0
    if isinstance(modify, bool) or not isinstance(modify, int) or not 0 <= modify < 2**64:
        raise ConfigInputError("ModifyIndex: expected a whole number")
    cfg.modify_index = modify
    return cfg
