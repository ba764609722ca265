"""One-line factories for nodes, jobs, allocs and evals, like Nomad's
`nomad/mock` package. Used by the scheduler's harness tests, the
integration tests and the benchmarks; every object is valid as it comes and
callers change what their scenario is about.
"""

from __future__ import annotations

from corral.domain import structs
from corral.domain.structs import (
    ClientStatus,
    DesiredStatus,
    Eligibility,
    EvalStatus,
    JobType,
    NodeStatus,
    Trigger,
    new_id,
)
from corral.v1 import structs_pb2 as pb


def node(
    *,
    datacenter: str = "dc1",
    node_class: str = "",
    cpu: int = 4000,
    memory_mb: int = 8192,
    disk_mb: int = 100 * 1024,
    attributes: dict[str, str] | None = None,
    meta: dict[str, str] | None = None,
    status: str = NodeStatus.READY,
    node_id: str | None = None,
) -> pb.Node:
    """A ready, eligible linux node with the raw_exec, exec and mock drivers."""
    nid = node_id or new_id()
    attrs = {
        "kernel.name": "linux",
        "os.name": "debian",
        "arch": "amd64",
        "nomad.version": "1.5.0",
        "driver.raw_exec": "1",
        "driver.exec": "1",
        "driver.mock": "1",
        "cpu.arch": "amd64",
        "unique.hostname": f"host-{nid[:8]}",
        "unique.network.ip-address": "192.168.0.100",
    }
    attrs.update(attributes or {})
    n = pb.Node(
        id=nid,
        secret_id=new_id(),
        name=f"node-{nid[:8]}",
        datacenter=datacenter,
        node_pool=structs.DEFAULT_NODE_POOL,
        node_class=node_class,
        attributes=attrs,
        meta=meta or {"pci-dss": "true", "database": "mysql", "version": "5.6"},
        drivers={
            "raw_exec": pb.DriverInfo(detected=True, healthy=True),
            "exec": pb.DriverInfo(detected=True, healthy=True),
            "mock": pb.DriverInfo(detected=True, healthy=True),
        },
        node_resources=pb.NodeResources(
            cpu=cpu,
            total_cores=4,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            min_dynamic_port=20000,
            max_dynamic_port=32000,
        ),
        reserved_resources=pb.NodeReservedResources(
            cpu=100, memory_mb=256, disk_mb=4 * 1024, reserved_host_ports="22"
        ),
        status=status,
        scheduling_eligibility=Eligibility.ELIGIBLE,
    )
    n.computed_class = structs.computed_class(n)
    return n


def task(
    name: str = "web", *, driver: str = "mock", cpu: int = 500, memory_mb: int = 256
) -> pb.Task:
    t = pb.Task(
        name=name,
        driver=driver,
        env={"FOO": "bar"},
        resources=pb.Resources(cpu=cpu, memory_mb=memory_mb),
        kill_timeout=5 * structs.SECOND,
    )
    t.config.update({"run_for": "10s"} if driver == "mock" else {"command": "/bin/date"})
    return t


def job(
    *,
    job_id: str | None = None,
    count: int = 10,
    job_type: str = JobType.SERVICE,
    datacenters: tuple[str, ...] = ("dc1",),
    priority: int = structs.DEFAULT_PRIORITY,
    cpu: int = 500,
    memory_mb: int = 256,
) -> pb.Job:
    """A service job with one group 'web' of `count` mock tasks."""
    jid = job_id or f"mock-{job_type}-{new_id()[:8]}"
    tg = pb.TaskGroup(
        name="web",
        count=count,
        tasks=[task("web", cpu=cpu, memory_mb=memory_mb)],
        restart_policy=pb.RestartPolicy(
            attempts=3, interval=10 * structs.MINUTE, delay=structs.MINUTE, mode="delay"
        ),
        reschedule_policy=structs.default_reschedule_policy(job_type),
        ephemeral_disk=pb.EphemeralDisk(size_mb=150),
    )
    j = pb.Job(
        id=jid,
        namespace=structs.DEFAULT_NAMESPACE,
        name=jid,
        type=job_type,
        priority=priority,
        datacenters=list(datacenters),
        node_pool=structs.DEFAULT_NODE_POOL,
        constraints=[pb.Constraint(l_target="${attr.kernel.name}", r_target="linux", operand="=")],
        task_groups=[tg],
        meta={"owner": "armon"},
        status=structs.JobStatus.PENDING,
        version=0,
        create_index=42,
        modify_index=99,
        job_modify_index=99,
    )
    return j


def batch_job(**kwargs: object) -> pb.Job:
    return job(job_type=JobType.BATCH, **kwargs)  # type: ignore[arg-type]


def system_job(**kwargs: object) -> pb.Job:
    kwargs.setdefault("count", 1)
    return job(job_type=JobType.SYSTEM, **kwargs)  # type: ignore[arg-type]


def sysbatch_job(**kwargs: object) -> pb.Job:
    kwargs.setdefault("count", 1)
    return job(job_type=JobType.SYSBATCH, **kwargs)  # type: ignore[arg-type]


def alloc(
    j: pb.Job,
    n: pb.Node,
    *,
    index: int = 0,
    group: str | None = None,
    client_status: str = ClientStatus.RUNNING,
    desired_status: str = DesiredStatus.RUN,
    eval_id: str | None = None,
) -> pb.Allocation:
    """An alloc of `j`'s group (default the first) placed on `n`."""
    tg = structs.task_group(j, group) if group else j.task_groups[0]
    assert tg is not None
    res = structs.total_task_resources(tg.tasks)
    res.disk_mb = tg.ephemeral_disk.size_mb
    a = pb.Allocation(
        id=new_id(),
        namespace=j.namespace,
        eval_id=eval_id or new_id(),
        name=structs.alloc_name(j.id, tg.name, index),
        node_id=n.id,
        node_name=n.name,
        job_id=j.id,
        job_version=j.version,
        job_modify_index=j.job_modify_index,
        job_type=j.type,
        job_priority=j.priority,
        task_group=tg.name,
        resources=res,
        desired_status=desired_status,
        client_status=client_status,
    )
    for t in tg.tasks:
        a.task_resources[t.name].CopyFrom(t.resources)
    return a


def eval_for(
    j: pb.Job,
    *,
    triggered_by: str = Trigger.JOB_REGISTER,
    status: str = EvalStatus.PENDING,
    node_id: str = "",
) -> pb.Evaluation:
    return pb.Evaluation(
        id=new_id(),
        namespace=j.namespace,
        priority=j.priority,
        type=j.type,
        triggered_by=triggered_by,
        job_id=j.id,
        job_modify_index=j.job_modify_index,
        node_id=node_id,
        status=status,
    )
