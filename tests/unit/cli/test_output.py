import io
import json

from cli.output import fmt_ago, kv, print_json, short, table, to_dict
from corral.v1 import structs_pb2 as pb


def test_table_aligns_columns():
    out = io.StringIO()
    table(("ID", "Status"), [("abc", "running"), ("abcdefgh", "pending")], out)
    assert out.getvalue().splitlines() == [
        "ID        Status",
        "abc       running",
        "abcdefgh  pending",
    ]


def test_kv_aligns_on_equals():
    out = io.StringIO()
    kv([("ID", "x"), ("Submit Date", "y")], out)
    assert out.getvalue().splitlines() == ["ID          = x", "Submit Date = y"]


def test_short_ids():
    assert short("0123456789abcdef") == "01234567"
    assert short("0123456789abcdef", verbose=True) == "0123456789abcdef"


def test_json_uses_proto_names_and_numbers():
    alloc = pb.Allocation(id="a", job_id="j", create_index=7, modify_time=1_700_000_000_000_000_000)
    d = to_dict(alloc)
    assert d["job_id"] == "j" and d["create_index"] == 7
    assert d["modify_time"] == 1_700_000_000_000_000_000
    assert d["client_status"] == ""  # zero values present: stable shapes for scripts
    out = io.StringIO()
    print_json([alloc, alloc], out)
    assert [x["id"] for x in json.loads(out.getvalue())] == ["a", "a"]


def test_fmt_ago():
    now = 1000.0
    assert fmt_ago(int(995 * 1e9), now) == "5s ago"
    assert fmt_ago(int((1000 - 125) * 1e9), now) == "2m5s ago"
    assert fmt_ago(0, now) == "<none>"
