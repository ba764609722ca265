"""Counters for the per-placement ledger (bench/ledger.py), inside a process.

`bench/ledger_site/sitecustomize.py` installs this in every process the
benchmark starts with that directory on PYTHONPATH (`bench/cluster.py`
does so for every role). A deployment never loads it: the roles carry no
flag, no check and no wrapper for it, so the ledger costs nothing when it
is off. Because it patches libraries rather than Corral's code, it counts
an older revision's roles the same way (`bench.ab`).

What it counts, from the moment the process starts:

* **protobuf encodes and decodes** by message type, with their bytes:
  every generated message class gets counting `SerializeToString`,
  `FromString`, `ParseFromString` and `MergeFromString` as protobuf's
  builder creates it (gRPC's generated stubs and servicers look these up
  on the class, so RPC payloads are counted too);
* **gRPC messages and bytes by method**, on the server side (the
  deserializer and serializer of each registered handler, wrapped in
  `grpc.method_handlers_generic_handler`, which every generated
  `add_*Servicer_to_server` calls) and the client side (the serializers a
  `grpc.aio` channel's multicallables use);
* **SQL statements** sent through psycopg (`execute` and `executemany` of
  its cursors; `Connection.execute` goes through them), by statement text.

It serves them on the process's Prometheus `/metrics` as
`corral_ledger_protobuf_total{op,type}` (and `_bytes_total`),
`corral_ledger_grpc_messages_total{side,direction,method}` (and
`corral_ledger_grpc_bytes_total`), `corral_ledger_sql_statements_total
{statement}` and `corral_ledger_probe 1`.

Every hook runs when its library is imported (a post-import hook on
`sys.meta_path`), so nothing is imported early. The counters are plain
lists bumped under the GIL: a thread switch inside `+=` can lose an
increment, which at the rates here is far below the figures' precision.
This file imports nothing from Corral or the bench: it must load on top
of any revision's code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: (op, message type) -> [count, bytes]; op is "encode" or "decode"
PROTOBUF: dict[tuple[str, str], list[int]] = {}
#: (side, direction, method) -> [messages, bytes]; side "server" or
#: "client", direction "request" or "response", method `/pkg.Service/Method`
GRPC: dict[tuple[str, str, str], list[int]] = {}
#: statement text -> [count]
SQL: dict[str, list[int]] = {}

_MARK = "_corral_ledger"
#: statement texts are kept up to this length (the key of the counter)
SQL_TEXT_LIMIT = 160

_installed = False


# ------------------------------------------------------------------ protobuf


def _counter(table: dict[Any, list[int]], key: Any) -> list[int]:
    found = table.get(key)
    if found is None:
        found = table[key] = [0, 0]
    return found


def patch_message_class(cls: Any) -> None:
    """Count encodes and decodes of one generated message class (and of its
    nested message types, map entries aside)."""
    if cls.__dict__.get(_MARK):
        return
    name = cls.DESCRIPTOR.full_name
    enc = _counter(PROTOBUF, ("encode", name))
    dec = _counter(PROTOBUF, ("decode", name))
    serialize = cls.SerializeToString
    serialize_partial = cls.SerializePartialToString
    from_string = cls.FromString
    parse = cls.ParseFromString
    merge = cls.MergeFromString

    def SerializeToString(self: Any, **kw: Any) -> bytes:
        data: bytes = serialize(self, **kw)
        enc[0] += 1
        enc[1] += len(data)
        return data

    def SerializePartialToString(self: Any, **kw: Any) -> bytes:
        data: bytes = serialize_partial(self, **kw)
        enc[0] += 1
        enc[1] += len(data)
        return data

    def FromString(data: bytes) -> Any:
        dec[0] += 1
        dec[1] += len(data)
        return from_string(data)

    def ParseFromString(self: Any, data: bytes) -> Any:
        dec[0] += 1
        dec[1] += len(data)
        return parse(self, data)

    def MergeFromString(self: Any, data: bytes) -> Any:
        dec[0] += 1
        dec[1] += len(data)
        return merge(self, data)

    cls.SerializeToString = SerializeToString
    cls.SerializePartialToString = SerializePartialToString
    cls.FromString = staticmethod(FromString)
    cls.ParseFromString = ParseFromString
    cls.MergeFromString = MergeFromString
    setattr(cls, _MARK, True)
    for nested in cls.DESCRIPTOR.nested_types:
        if nested.GetOptions().map_entry:
            continue
        inner = getattr(cls, nested.name, None)
        if inner is not None:
            patch_message_class(inner)


def _is_message_class(value: Any) -> bool:
    from google.protobuf.message import Message

    return isinstance(value, type) and issubclass(value, Message) and value is not Message


def _hook_protobuf_builder(module: Any) -> None:
    build = module.BuildTopDescriptorsAndMessages
    if getattr(build, _MARK, False):
        return

    def BuildTopDescriptorsAndMessages(file_des: Any, module_name: str, scope: Any) -> Any:
        result = build(file_des, module_name, scope)
        for value in list(scope.values()):
            if _is_message_class(value):
                patch_message_class(value)
        return result

    setattr(BuildTopDescriptorsAndMessages, _MARK, True)
    module.BuildTopDescriptorsAndMessages = BuildTopDescriptorsAndMessages


# ------------------------------------------------------------------ gRPC


def counting_deserializer(
    fn: Callable[[bytes], Any] | None, counter: list[int]
) -> Callable[[bytes], Any]:
    """`fn` (None: the raw bytes, as gRPC passes them) counting what it reads."""

    def deserialize(data: bytes) -> Any:
        counter[0] += 1
        counter[1] += len(data)
        return data if fn is None else fn(data)

    setattr(deserialize, _MARK, True)
    return deserialize


def counting_serializer(
    fn: Callable[[Any], bytes] | None, counter: list[int]
) -> Callable[[Any], bytes]:
    """`fn` (None: the message is already bytes) counting what it writes."""

    def serialize(message: Any) -> bytes:
        data: bytes = message if fn is None else fn(message)
        counter[0] += 1
        counter[1] += len(data)
        return data

    setattr(serialize, _MARK, True)
    serialize.counter = counter  # type: ignore[attr-defined]  # see _hook_server
    return serialize


def _hook_server(module: Any) -> None:
    """corral.runtime.server's interceptor wraps each handler's serializer
    in a pass-through that sends bytes as they are (a forwarded answer, or
    the state's Subscribe, whose batches are serialized once for every
    subscriber): bytes never reach the counted serializer inside, so the
    pass-through counts them into its counter."""
    passthrough = module._passthrough
    if getattr(passthrough, _MARK, False):
        return

    def counted_passthrough(serialize: Any) -> Any:
        out = passthrough(serialize)
        counter = getattr(serialize, "counter", None)
        if out is None or counter is None:
            return out

        def send(message: Any) -> bytes:
            if isinstance(message, bytes):
                counter[0] += 1
                counter[1] += len(message)
                return message
            data: bytes = out(message)
            return data

        return send

    setattr(counted_passthrough, _MARK, True)
    module._passthrough = counted_passthrough


def wrap_server_handlers(service: str, handlers: dict[str, Any]) -> None:
    """Count the messages and bytes of each handler of `service`, in place
    (the generated code hands the same dict to the server's fast path)."""
    for method, handler in list(handlers.items()):
        des, ser = handler.request_deserializer, handler.response_serializer
        full = f"/{service}/{method}"
        # each side on its own: a handler rebuilt from a counted one keeps
        # its counted deserializer and may bring a serializer of its own
        # (the state's pass-through for Subscribe)
        if not getattr(des, _MARK, False):
            des = counting_deserializer(des, _counter(GRPC, ("server", "request", full)))
        if not getattr(ser, _MARK, False):
            ser = counting_serializer(ser, _counter(GRPC, ("server", "response", full)))
        handlers[method] = handler._replace(request_deserializer=des, response_serializer=ser)


def _hook_grpc(module: Any) -> None:
    generic = module.method_handlers_generic_handler
    if getattr(generic, _MARK, False):
        return

    def method_handlers_generic_handler(service: str, method_handlers: dict[str, Any]) -> Any:
        wrap_server_handlers(service, method_handlers)
        return generic(service, method_handlers)

    setattr(method_handlers_generic_handler, _MARK, True)
    module.method_handlers_generic_handler = method_handlers_generic_handler


def _method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


def _hook_aio_channel(module: Any) -> None:
    channel = module.Channel
    if channel.__dict__.get(_MARK):
        return
    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        original = getattr(channel, kind, None)
        if original is None:
            continue

        def make(original: Any) -> Any:
            def multicallable(
                self: Any,
                method: str | bytes,
                request_serializer: Any = None,
                response_deserializer: Any = None,
                *args: Any,
                **kwargs: Any,
            ) -> Any:
                name = _method_name(method)
                return original(
                    self,
                    method,
                    counting_serializer(
                        request_serializer, _counter(GRPC, ("client", "request", name))
                    ),
                    counting_deserializer(
                        response_deserializer, _counter(GRPC, ("client", "response", name))
                    ),
                    *args,
                    **kwargs,
                )

            return multicallable

        setattr(channel, kind, make(original))
    setattr(channel, _MARK, True)


# ------------------------------------------------------------------ SQL


def statement_key(query: Any) -> str:
    """The counter key of a statement: its text, whitespace collapsed, cut
    at `SQL_TEXT_LIMIT` characters (a `psycopg.sql.Composable` by its
    class name: rendering it needs a connection)."""
    if isinstance(query, bytes):
        query = query.decode(errors="replace")
    if not isinstance(query, str):
        return f"<{type(query).__name__}>"
    return " ".join(query.split())[:SQL_TEXT_LIMIT]


def _sql_counter(query: Any) -> list[int]:
    # the raw query object is the fast key (literal strings are the same
    # object on every call); the collapsed text is computed once per query
    found = SQL.get(query) if isinstance(query, str) else None
    if found is None:
        found = _counter(SQL, statement_key(query))
        if isinstance(query, str):
            SQL[query] = found
    return found


def _hook_psycopg(module: Any) -> None:
    for cls_name in ("Cursor", "AsyncCursor"):
        cls = getattr(module, cls_name, None)
        if cls is None or cls.__dict__.get(_MARK):
            continue
        for meth in ("execute", "executemany"):
            original = getattr(cls, meth)

            def make(original: Any) -> Any:
                def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
                    _sql_counter(query)[0] += 1
                    return original(self, query, *args, **kwargs)

                return counted

            setattr(cls, meth, make(original))
        setattr(cls, _MARK, True)


# ------------------------------------------------------------------ /metrics


def sql_totals() -> dict[str, int]:
    """Statements by their collapsed text (the raw-text aliases merged)."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    for key, counter in list(SQL.items()):
        if id(counter) in seen:
            continue
        seen.add(id(counter))
        if counter[0]:
            out[statement_key(key)] = out.get(statement_key(key), 0) + counter[0]
    return out


class LedgerCollector:
    """Serves the counters on the default Prometheus registry."""

    def describe(self) -> Sequence[Any]:
        return []  # registered without a collect at registration time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        probe = GaugeMetricFamily("corral_ledger_probe", "1: this process counts the ledger")
        probe.add_metric([], 1)
        yield probe
        pb_n = CounterMetricFamily(
            "corral_ledger_protobuf", "protobuf encodes and decodes", labels=["op", "type"]
        )
        pb_b = CounterMetricFamily(
            "corral_ledger_protobuf_bytes",
            "protobuf bytes encoded and decoded",
            labels=["op", "type"],
        )
        for (op, name), (n, b) in sorted(PROTOBUF.items()):
            if n:
                pb_n.add_metric([op, name], n)
                pb_b.add_metric([op, name], b)
        yield pb_n
        yield pb_b
        labels = ["side", "direction", "method"]
        rpc_n = CounterMetricFamily("corral_ledger_grpc_messages", "gRPC messages", labels=labels)
        rpc_b = CounterMetricFamily(
            "corral_ledger_grpc_bytes", "gRPC message bytes (protobuf payloads)", labels=labels
        )
        for key, (n, b) in sorted(GRPC.items()):
            if n:
                rpc_n.add_metric(list(key), n)
                rpc_b.add_metric(list(key), b)
        yield rpc_n
        yield rpc_b
        sql = CounterMetricFamily(
            "corral_ledger_sql_statements", "SQL statements sent", labels=["statement"]
        )
        for text, n in sorted(sql_totals().items()):
            sql.add_metric([text], n)
        yield sql


def _hook_prometheus(module: Any) -> None:
    registry = module.REGISTRY
    if getattr(registry, _MARK, False):
        return
    registry.register(LedgerCollector())
    setattr(registry, _MARK, True)


# ------------------------------------------------------------------ install

HOOKS: dict[str, Callable[[Any], None]] = {
    "google.protobuf.internal.builder": _hook_protobuf_builder,
    "grpc": _hook_grpc,
    "grpc.aio._channel": _hook_aio_channel,
    "corral.runtime.server": _hook_server,
    "psycopg": _hook_psycopg,
    "prometheus_client": _hook_prometheus,
}


class _PostImportHooks:
    """A meta-path finder that finds nothing itself: for a hooked module it
    asks the finders after it, and runs the hook once the module executed."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_hook(module: Any) -> None:
            exec_module(module)
            hook(module)

        loader.exec_module = exec_and_hook  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Hook every library listed in `HOOKS`, now if it is already imported,
    else when it is."""
    global _installed
    if _installed:
        return
    _installed = True
    for name, hook in HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])
    sys.meta_path.insert(0, _PostImportHooks(HOOKS))
