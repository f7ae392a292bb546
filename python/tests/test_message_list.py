"""The codec's tables are messages.json's: every message, id, field, type and rule."""

from __future__ import annotations

import json
import os

import pytest

from conftest import PROTOCOL_DIR
from rlbus import protocol as P

with open(os.path.join(PROTOCOL_DIR, "messages.json"), encoding="utf-8") as _f:
    DOC = json.load(_f)


def test_every_message_and_field_matches_messages_json() -> None:
    assert sorted(P.MESSAGES) == sorted(m["name"] for m in DOC["messages"])
    for m in DOC["messages"]:
        spec = P.MESSAGES[m["name"]]
        assert spec.id == m["id"] and P.BY_ID[m["id"]] is spec
        assert [f.as_dict() for f in spec.fields] == m.get("fields", [])
        assert spec.header == bytes([0x52, 0x4C, DOC["version"], m["id"]])
        assert spec.payload_frame == m.get("payload_frame", False)
    # the bus's two messages of three frames (SPEC §17.1.1), and no other
    assert sorted(n for n, s in P.MESSAGES.items() if s.payload_frame) == ["DELIVER", "PUBLISH"]


def test_limits_are_those_of_messages_json() -> None:
    assert P.LIMITS == DOC["limits"]


@pytest.mark.parametrize("n,ok", [(P.LIMITS["max_depth"], True), (P.LIMITS["max_depth"] + 1, False)])
def test_depth_limit_boundary(n: int, ok: bool) -> None:
    # the body map is level 1; an unknown field nested so that n containers are open
    inner = b"\x91" * (n - 2) + b"\x90"
    body = b"\x81\xa1x" + inner
    head = P.header(P.type_id("HEARTBEAT"))
    if ok:
        assert P.decode([head, body]).name == "HEARTBEAT"
    else:
        with pytest.raises(P.ProtocolError) as e:
            P.decode([head, body])
        assert e.value.code == 401


@pytest.mark.parametrize("size,ok", [(P.LIMITS["max_str"], True), (P.LIMITS["max_str"] + 1, False)])
def test_str_limit_boundary(size: int, ok: bool) -> None:
    import msgpack
    body = msgpack.packb({"x": "a" * size})
    head = P.header(P.type_id("HEARTBEAT"))
    if ok:
        P.decode([head, body])
    else:
        with pytest.raises(P.ProtocolError):
            P.decode([head, body])


def test_framing_errors() -> None:
    with pytest.raises(P.ProtocolError) as e:
        P.decode([b"RL\x01", b"\x80"])
    assert e.value.code == 400
    with pytest.raises(P.ProtocolError) as e:
        P.decode([b"RL\x02\x03", b"\x80"])
    assert e.value.code == 405
    with pytest.raises(P.ProtocolError) as e:
        P.decode([b"RL\x01\x7f", b"\x80"])
    assert e.value.code == 404
    with pytest.raises(P.ProtocolError) as e:
        P.decode([b"RL\x01\x03"])
    assert e.value.code == 400


def test_encode_checks_fields() -> None:
    with pytest.raises(P.ProtocolError) as e:
        P.encode("STARTED", {"task_id": "bad id", "attempt": 1})
    assert e.value.code == 402 and "task_id" in e.value.reason
