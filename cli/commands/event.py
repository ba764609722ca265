"""`corral event stream`: the change log as users see it, in index order."""

from __future__ import annotations

import argparse
import json

from cli.commands import group
from cli.context import CliError, Context, common
from cli.output import to_dict
from corral.domain import topics
from corral.v1 import event_pb2
from corral.v1 import structs_pb2 as pb

TOPICS = (*topics.STREAMED_NAMES, topics.ANY)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    events = group(sub, "event", "Watch the event stream")
    p = events.add_parser("stream", help="Print events as they happen, in index order")
    p.add_argument(
        "-topic",
        "--topic",
        dest="topics",
        action="append",
        default=[],
        metavar="TOPIC[:KEY]",
        help="e.g. Job:hello, Evaluation, Allocation:*; repeatable",
    )
    p.add_argument(
        "-index",
        "--index",
        dest="index",
        type=int,
        default=0,
        help="start after this index (0: from now)",
    )
    p.add_argument("-namespace", "--namespace", default="")
    p.add_argument(
        "-heartbeats",
        "--heartbeats",
        dest="heartbeats",
        action="store_true",
        help="also print the 10 s heartbeats",
    )
    common(p, json=True)
    p.set_defaults(func=cmd_stream)


def parse_topic(text: str) -> event_pb2.EventTopic:
    topic, _, key = text.partition(":")
    topic = topics.parse_alias(topic)
    if topic not in TOPICS:
        raise CliError(f"unknown topic {topic!r} (expected one of {', '.join(TOPICS)})")
    return event_pb2.EventTopic(topic=topic, key="" if key in ("", topics.ANY) else key)


def cmd_stream(args: argparse.Namespace, ctx: Context) -> int:
    if args.index < 0:
        raise CliError("-index must not be negative")
    req = event_pb2.EventStreamRequest(
        topics=[parse_topic(t) for t in args.topics],
        from_index=args.index,
        namespace=args.namespace,
    )
    for resp in ctx.client.events.Stream(req):
        if resp.heartbeat:
            if args.heartbeats:
                ctx.out.write(
                    json.dumps({"index": resp.index, "heartbeat": True}) + "\n"
                    if args.json
                    else f"{resp.index:>8}  (heartbeat)\n"
                )
                ctx.out.flush()
            continue
        for ev in resp.events:
            if args.json:
                ctx.out.write(json.dumps(to_dict(ev)) + "\n")
            else:
                ctx.out.write(
                    f"{ev.index:>8}  {ev.topic:<11} {ev.type:<30} {ev.key}{_detail(ev)}\n"
                )
        ctx.out.flush()
    return 0


def _detail(ev: pb.Event) -> str:
    """A few words of what changed, for the human view."""
    topic = topics.of(ev)
    if topic is topics.EVALUATION:
        e = ev.evaluation
        return f"  job={e.job_id} status={e.status} triggered_by={e.triggered_by}"
    if topic is topics.ALLOCATION:
        a = ev.allocation
        return (
            f"  job={a.job_id} group={a.task_group} "
            f"desired={a.desired_status} client={a.client_status}"
        )
    if topic is topics.JOB:
        j = ev.job
        return f"  version={j.version} status={j.status}" + (" stop" if j.stop else "")
    if topic is topics.NODE:
        n = ev.node
        return f"  status={n.status} eligibility={n.scheduling_eligibility}"
    if topic is topics.DEPLOYMENT:
        return f"  job={ev.deployment.job_id} status={ev.deployment.status}"
    if topic is topics.VARIABLE:
        v = ev.variable
        return f"  namespace={v.namespace} modify_index={v.modify_index}" + (
            " deleted" if ev.deleted else ""
        )
    return ""
