"""The pure rules of namespaces, node pools and scaling policies
(corral.domain.namespaces, node_pools, scaling, object_specs), their place
in the in-memory state, and the `scaling` blocks of job files."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from corral.domain import namespaces, node_pools, object_specs, scaling, topics
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job
from corral.domain.store import StateStore
from corral.testing import mock
from corral.v1 import structs_pb2 as pb

# ------------------------------------------------------------ namespaces


def _ns(**cfg: object) -> pb.Namespace:
    ns = pb.Namespace(name="team")
    if "default" in cfg:
        ns.node_pool_config.default = str(cfg["default"])
    for which in ("allowed", "denied"):
        if which in cfg:
            getattr(ns.node_pool_config, which).SetInParent()
            getattr(ns.node_pool_config, which).values.extend(cfg[which])  # type: ignore[arg-type]
    return ns


def test_pools_a_namespace_admits() -> None:
    plain = _ns()
    assert namespaces.default_pool(plain) == "default"
    assert namespaces.pool_allowed(plain, "anything")
    allowed = _ns(default="gpu", allowed=["batch-*"])
    assert namespaces.default_pool(allowed) == "gpu"
    assert namespaces.pool_allowed(allowed, "gpu")  # the default always
    assert namespaces.pool_allowed(allowed, "batch-1")
    assert not namespaces.pool_allowed(allowed, "default")
    only_default = _ns(default="gpu", allowed=[])  # empty: the default only
    assert namespaces.pool_allowed(only_default, "gpu")
    assert not namespaces.pool_allowed(only_default, "batch-1")
    denied = _ns(denied=["secret-*"])
    assert namespaces.pool_allowed(denied, "default")
    assert not namespaces.pool_allowed(denied, "secret-1")


@pytest.mark.parametrize(
    ("ns", "field", "problem"),
    [
        (pb.Namespace(name="a_b"), "name", "letters, digits or '-'"),
        (pb.Namespace(name="a", description="x" * 257), "description", "longer than 256"),
        (_ns(allowed=["a"], denied=["b"]), "node_pool_config", "either allowed or denied"),
        (_ns(allowed=["bad pool"]), "node_pool_config.allowed[0]", "not a node pool name"),
        (_ns(default="gpu", denied=["g*"]), "node_pool_config.denied", "denies the default pool"),
    ],
)
def test_namespace_config_problems(ns: pb.Namespace, field: str, problem: str) -> None:
    found = namespaces.config_problem(ns)
    assert found is not None and found[0] == field and problem in found[1]


def test_admission_names_the_problem() -> None:
    job = mock.job()
    job.node_pool = "gpu"
    assert namespaces.admission_problem(job, None, True) == (
        "job.namespace",
        f"job {job.id!r} is in nonexistent namespace 'default'",
    )
    ns = _ns(allowed=["batch-*"])
    assert namespaces.admission_problem(job, ns, False) == (
        "job.node_pool",
        f"job {job.id!r} is in nonexistent node pool 'gpu'",
    )
    assert namespaces.admission_problem(job, ns, True) == (
        "job.node_pool",
        "node pool 'gpu' is not allowed in namespace 'team'",
    )
    ns = _ns()
    ns.capabilities.disabled_task_drivers.append(job.task_groups[0].tasks[0].driver)
    found = namespaces.admission_problem(job, ns, True)
    assert found is not None and "not allowed in namespace 'team'" in found[1]
    ns = _ns()
    ns.capabilities.enabled_network_modes.append("bridge")
    job.task_groups[0].networks.add(mode="host")
    found = namespaces.admission_problem(job, ns, True)
    assert found is not None and "network mode(s) 'host'" in found[1]


# ------------------------------------------------------------ node pools


def test_built_in_pools_and_membership() -> None:
    assert {p.name for p in node_pools.built_in()} == {"all", "default"}
    node = mock.node()
    node.node_pool = "gpu"
    assert node_pools.node_in_pool(node, "all") and node_pools.node_in_pool(node, "gpu")
    assert not node_pools.node_in_pool(node, "default")
    assert node_pools.config_problem(pb.NodePool(name="a b")) is not None
    bad = pb.NodePool(name="gpu")
    bad.scheduler_config.scheduler_algorithm = "random"
    assert node_pools.config_problem(bad) == (
        "scheduler_config.scheduler_algorithm",
        "unknown algorithm 'random' (expected binpack or spread)",
    )


def test_effective_scheduler_config() -> None:
    cluster = pb.SchedulerConfiguration(scheduler_algorithm="binpack")
    assert node_pools.effective_config(cluster, None) is cluster
    assert node_pools.effective_config(cluster, pb.NodePool(name="x")) is cluster
    pool = pb.NodePool(name="x")
    pool.scheduler_config.memory_oversubscription_enabled = True
    got = node_pools.effective_config(cluster, pool)
    assert got.scheduler_algorithm == "binpack" and got.memory_oversubscription_enabled
    pool.scheduler_config.scheduler_algorithm = "spread"
    assert node_pools.effective_config(cluster, pool).scheduler_algorithm == "spread"
    assert cluster.scheduler_algorithm == "binpack"  # not changed in place


# ------------------------------------------------------------ scaling


def _scaled_job(count: int = 3) -> pb.Job:
    job = mock.job(count=count)
    job.task_groups[0].scaling.max = 10
    job.task_groups[0].tasks[0].scaling_policies.add(type=scaling.VERTICAL_CPU, max=2000)
    return job


def test_scaling_defaults_and_targets() -> None:
    job = _scaled_job()
    scaling.canonicalize(job)
    group = job.task_groups[0].scaling
    assert (group.type, group.min, group.enabled) == ("horizontal", 3, True)
    assert dict(group.target) == {"Namespace": "default", "Job": job.id, "Group": "web"}
    task = job.task_groups[0].tasks[0].scaling_policies[0]
    assert (task.min, task.enabled, task.target["Task"]) == (0, True, "web")
    assert [scaling.key(p) for p in scaling.embedded(job)] == [
        ("horizontal", "web", ""),
        ("vertical_cpu", "web", "web"),
    ]


@pytest.mark.parametrize(
    ("change", "path", "problem"),
    [
        (lambda j: j.task_groups[0].scaling.ClearField("max"), "scaling.max", "is required"),
        (lambda j: setattr(j.task_groups[0].scaling, "max", 2), "scaling.max", "count (3)"),
        (lambda j: setattr(j.task_groups[0].scaling, "min", 4), "scaling.min", "count (3)"),
        (
            lambda j: setattr(j.task_groups[0].scaling, "type", "vertical_cpu"),
            "type",
            "'horizontal'",
        ),
        (
            lambda j: setattr(j.task_groups[0].tasks[0].scaling_policies[0], "type", "horizontal"),
            "scaling_policies[0].type",
            "'vertical_cpu' or 'vertical_mem'",
        ),
    ],
)
def test_scaling_problems(change: object, path: str, problem: str) -> None:
    job = _scaled_job()
    change(job)  # type: ignore[operator]
    found = scaling.problem(job)
    assert found is not None and found[0].endswith(path) and problem in found[1], found


def test_scale_bounds_and_ids() -> None:
    job = _scaled_job()
    scaling.canonicalize(job)
    tg = job.task_groups[0]
    assert scaling.count_problem(tg, 11) == (
        "group count was greater than scaling policy maximum: 11 > 10"
    )
    assert scaling.count_problem(tg, 2) == "group count was less than scaling policy minimum: 2 < 3"
    assert scaling.count_problem(tg, 10) is None
    scaling.assign_ids(job, {("horizontal", "web", ""): "kept"})
    ids = [p.id for p in scaling.embedded(job)]
    assert ids[0] == "kept" and ids[1] and ids[1] != "kept"


# ------------------------------------------------------------ the in-memory state


def test_store_keeps_the_objects_and_their_indexes() -> None:
    store = StateStore()
    policy = pb.ScalingPolicy(id="p1", type="horizontal", target={"Namespace": "n", "Job": "j"})
    events = pb.JobScalingEvents(namespace="n", job_id="j")
    events.scaling_events["web"].events.add(message="up")
    batch = pb.ChangeBatch(index=5)
    batch.events.add(topic=topics.NAMESPACE.name, namespace_object=pb.Namespace(name="n"))
    batch.events.add(topic=topics.NODE_POOL.name, node_pool=pb.NodePool(name="gpu"))
    batch.events.add(topic=topics.SCALING_POLICY.name, scaling_policy=policy)
    batch.events.add(topic=topics.SCALING_EVENT.name, job_scaling_events=events)
    snap = store.apply(batch)
    assert snap.namespace_by_name("n") is not None and snap.node_pool_by_name("gpu") is not None
    assert [p.id for p in snap.scaling_policies_by_job("n", "j")] == ["p1"]
    found = snap.scaling_events_by_job("n", "j")
    assert found is not None and found.scaling_events["web"].events[0].message == "up"
    assert {t: snap.table_index(t) for t in ("namespaces", "node_pools")} == {
        "namespaces": 5,
        "node_pools": 5,
    }
    gone = pb.ChangeBatch(index=6)
    gone.events.add(topic=topics.SCALING_POLICY.name, scaling_policy=policy, deleted=True)
    gone.events.add(topic=topics.NODE_POOL.name, node_pool=pb.NodePool(name="gpu"), deleted=True)
    snap = store.apply(gone)
    assert snap.scaling_policy_by_id("p1") is None and not snap.scaling_policies_by_job("n", "j")
    assert snap.node_pool_by_name("gpu") is None and snap.table_index("scaling_policy") == 6


# ------------------------------------------------------------ specs


def test_namespace_and_pool_specs_from_hcl_and_json() -> None:
    ns = object_specs.namespace_from_hcl(
        'name = "prod"\ndescription = "p"\nmeta { team = "a" }\n'
        'node_pool_config {\n  default = "gpu"\n  allowed = []\n}\n'
        'capabilities { disabled_task_drivers = ["raw_exec"] }\n'
    )
    assert (ns.name, ns.description, dict(ns.meta)) == ("prod", "p", {"team": "a"})
    assert ns.node_pool_config.HasField("allowed") and not ns.node_pool_config.allowed.values
    assert list(ns.capabilities.disabled_task_drivers) == ["raw_exec"]
    same = object_specs.namespace_from_nomad(
        json.loads(
            '{"name": "prod", "Description": "p", "Meta": {"team": "a"}, '
            '"NodePoolConfiguration": {"Default": "gpu", "Allowed": []}, '
            '"Capabilities": {"DisabledTaskDrivers": ["raw_exec"]}, "Quota": ""}'
        )
    )
    assert same == ns
    pool = object_specs.node_pool_from_hcl(
        'node_pool "gpu" {\n  description = "GPUs"\n'
        '  scheduler_config {\n    scheduler_algorithm = "spread"\n'
        "    memory_oversubscription_enabled = false\n  }\n}\n"
    )
    assert pool.scheduler_config.HasField("memory_oversubscription_enabled")
    assert (pool.name, pool.scheduler_config.scheduler_algorithm) == ("gpu", "spread")


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (object_specs.namespace_from_hcl, 'name = "a"\nquota = "q"', "quotas are not supported"),
        (object_specs.namespace_from_hcl, 'name = "a"\nvault { default = "x" }', "Vault"),
        (object_specs.namespace_from_hcl, 'name = "a"\ncolour = "x"', "colour: unknown field"),
        (object_specs.namespace_from_hcl, 'name = "a" {', "not valid HCL"),
        (object_specs.node_pool_from_hcl, 'node_pool { description = "x" }', "needs exactly one"),
        (
            object_specs.node_pool_from_hcl,
            'node_pool "a" { node_identity_ttl = "1h" }',
            "node identity TTLs are not supported",
        ),
    ],
)
def test_spec_problems(parse: object, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(text)  # type: ignore[operator]


# ------------------------------------------------------------ job files

#: nomad-autoscaler's policy/nomad/test-fixtures/src/full-scaling.hcl, trimmed
FULL_SCALING = """
job "full-scaling" {
  type = "batch"
  group "test" {
    scaling {
      min     = 2
      max     = 10
      enabled = false
      policy {
        evaluation_interval = "5s"
        cooldown            = "5m"
        target "target" {
          int_config  = 2
          bool_config = true
        }
        check "check-1" {
          source = "source-1"
          query  = "query-1"
          strategy "strategy-1" {
            str_config = "str"
          }
        }
        check "check-2" {
          source = "source-2"
          strategy "strategy-2" {
            int_config = 2
          }
        }
      }
    }
    task "echo" {
      driver = "raw_exec"
      config {
        command = "echo"
        args    = ["hi"]
      }
      scaling "cpu" {
        max = 2000
      }
      scaling "mem" {
        max = 1024
      }
    }
  }
}
"""


def test_hcl_scaling_block_in_nomads_shape() -> None:
    """The policy document comes out as Nomad's parser hands it to the
    autoscaler (its golden file full-scaling.json.golden): blocks as lists,
    a labelled block as {label: [body]}."""
    job = parse_job(FULL_SCALING, "full.hcl")
    tg = job.task_groups[0]
    assert tg.count == 2  # no count: the scaling minimum
    p = tg.scaling
    assert (p.type, p.min, p.max, p.enabled) == ("horizontal", 2, 10, False)
    doc = json_format.MessageToDict(p.policy)
    assert doc["cooldown"] == "5m" and doc["evaluation_interval"] == "5s"
    assert doc["target"] == [{"target": [{"int_config": 2.0, "bool_config": True}]}]
    assert doc["check"] == [
        {
            "check-1": [
                {
                    "source": "source-1",
                    "query": "query-1",
                    "strategy": [{"strategy-1": [{"str_config": "str"}]}],
                }
            ]
        },
        {"check-2": [{"source": "source-2", "strategy": [{"strategy-2": [{"int_config": 2.0}]}]}]},
    ]
    types = [(s.type, s.max) for s in tg.tasks[0].scaling_policies]
    assert types == [("vertical_cpu", 2000), ("vertical_mem", 1024)]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("      max     = 10\n", "", "scaling > max: is required"),
        ('      scaling "mem" {', '      scaling "disk" {', 'scaling policy name must be "cpu"'),
        ('      scaling "mem" {', '      scaling "cpu" {', 'only one scaling "cpu" block'),
        ("      enabled = false\n", '      enabled = false\n      type = "vertical_mem"\n', "type"),
        ("      min     = 2\n", "      min     = 2\n      count = 3\n", "unknown argument 'count'"),
    ],
)
def test_hcl_scaling_mistakes(old: str, new: str, message: str) -> None:
    with pytest.raises(JobspecError, match=message):
        parse_job(FULL_SCALING.replace(old, new, 1), "full.hcl")


def test_nomad_json_scaling() -> None:
    """Nomad's JSON (`nomad job run -output`) keeps the same policy."""
    data = {
        "Job": {
            "ID": "web",
            "TaskGroups": [
                {
                    "Name": "web",
                    "Count": 2,
                    "Scaling": {
                        "Min": 1,
                        "Max": 5,
                        "Enabled": True,
                        "Type": "horizontal",
                        "Policy": {"cooldown": "1m", "check": [{"c": [{"source": "prometheus"}]}]},
                    },
                    "Tasks": [{"Name": "t", "Driver": "mock", "Config": {"run_for": "1s"}}],
                }
            ],
        }
    }
    job = parse_job(json.dumps(data), "web.json")
    p = job.task_groups[0].scaling
    assert (p.min, p.max, p.enabled, p.target["Job"]) == (1, 5, True, "web")
    assert p.policy["cooldown"] == "1m"
