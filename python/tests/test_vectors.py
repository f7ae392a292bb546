"""The codec against protocol/vectors: every golden vector decodes to its listed meaning and
re-encodes byte for byte; every invalid vector is refused with its code. A vector of PUBLISH
or DELIVER travels in three frames, its payload frame in ``payload_hex`` (SPEC §17.1.1)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import pytest

from conftest import PROTOCOL_DIR
from rlbus import protocol as P


def _load(name: str) -> List[Dict[str, Any]]:
    with open(os.path.join(PROTOCOL_DIR, "vectors", name), encoding="utf-8") as f:
        return list(json.load(f)["vectors"])


VALID = _load("valid.json")
INVALID = _load("invalid.json")
EVENTS = _load("events.json")


def from_json(v: Any) -> Any:
    """A vector's JSON meaning as Python values ({"$bin_hex": h} -> bytes)."""
    if isinstance(v, dict):
        if set(v) == {"$bin_hex"}:
            return bytes.fromhex(v["$bin_hex"])
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def meaning(v: Any) -> Any:
    return v.value() if isinstance(v, P.Raw) else v


def frames_of(vec: Dict[str, Any]) -> List[bytes]:
    """The frames a vector travels in: header, body and, when it has one, its payload."""
    out = [bytes.fromhex(vec["header_hex"]), bytes.fromhex(vec["body_hex"])]
    if "payload_hex" in vec:
        out.append(bytes.fromhex(vec["payload_hex"]))
    return out


def payload_of(vec: Dict[str, Any]) -> Any:
    return bytes.fromhex(vec["payload_hex"]) if "payload_hex" in vec else None


@pytest.mark.parametrize("vec", VALID + INVALID, ids=[v["name"] for v in VALID + INVALID])
def test_payload_hex_is_given_exactly_for_payload_frame_messages(vec: Dict[str, Any]) -> None:
    spec = P.BY_ID[bytes.fromhex(vec["header_hex"])[3]]
    assert ("payload_hex" in vec) == spec.payload_frame


@pytest.mark.parametrize("vec", VALID, ids=[v["name"] for v in VALID])
def test_valid_vector_round_trip(vec: Dict[str, Any]) -> None:
    frames = tuple(frames_of(vec))
    m = P.decode(frames)
    assert m.name == vec["type"]
    assert {k: meaning(x) for k, x in m.fields.items()} == from_json(vec["fields"])
    assert m.payload == payload_of(vec)
    # byte for byte from the decoded message (verbatim fields as the bytes received) ...
    assert P.encode(m.name, m.fields, m.payload) == frames
    # ... and from the plain meaning (the vectors are canonical)
    assert P.encode(vec["type"], from_json(vec["fields"]), payload_of(vec)) == frames
    if len(frames) == 3:  # the payload frame is part of the message: without it, 400
        with pytest.raises(P.ProtocolError) as err:
            P.decode(frames[:2])
        assert err.value.code == 400


@pytest.mark.parametrize("vec", INVALID, ids=[v["name"] for v in INVALID])
def test_invalid_vector_refused(vec: Dict[str, Any]) -> None:
    with pytest.raises(P.ProtocolError) as err:
        P.decode(frames_of(vec))
    assert err.value.code == vec["error_code"], err.value.reason


@pytest.mark.parametrize("vec", EVENTS, ids=[v["name"] for v in EVENTS])
def test_event_vector_round_trip(vec: Dict[str, Any]) -> None:
    frames = [vec["topic"].encode(), bytes.fromhex(vec["header_hex"]),
              bytes.fromhex(vec["body_hex"])]
    ev = P.decode_event(frames)
    assert {k: meaning(x) for k, x in ev.fields.items()} == from_json(vec["fields"])
    assert P.encode_event(ev.topic, ev.fields) == tuple(frames)


@pytest.mark.parametrize("vec", VALID, ids=[v["name"] for v in VALID])
def test_encoded_once_writes_the_vector(vec: Dict[str, Any]) -> None:
    """A message encoded once ahead of sending (P.Encoded) travels as the same bytes."""
    body = bytes.fromhex(vec["body_hex"])
    fields = from_json(vec["fields"])
    P.check_body(vec["type"], fields)
    e = P.Encoded(vec["type"], fields)
    assert e.body == body and dict(e) == fields
    assert P.encode(vec["type"], e, payload_of(vec)) == tuple(frames_of(vec))


def test_encoded_and_check_body_refuse_what_encode_refuses() -> None:
    bad = {"task_id": "t", "attempt": 0, "data_id": "d", "buffer_id": "b", "meta": {},
           "index": 1}
    for call in (lambda: P.check_body("DATA", bad), lambda: P.Encoded("DATA", bad)):
        with pytest.raises(P.ProtocolError) as err:
            call()
        assert err.value.code == 402 and "attempt" in err.value.reason
    e = P.Encoded("DATA", dict(bad, attempt=1))
    # another message name is encoded from the fields, not from the stored body
    with pytest.raises(P.ProtocolError):
        P.encode("INFO", e)


def test_user_map_holds_user_data_to_the_decoders_limits() -> None:
    flat = {"env_id": 3, "priority": 1.0, "tag": "é", 7: None, "raw": b"\x00"}
    assert P.user_map(flat) == P.Raw.of(flat) and P.user_map(flat).value() == flat
    nested = {"a": [{"b": 1}]}
    assert P.user_map(nested) == P.pack_value(nested)
    deep: Any = 0
    for _ in range(15):
        deep = [deep]
    for bad in ({"x": deep},                      # 17 levels in a body
                {"s": "x" * (P.LIMITS["max_str"] + 1)},
                {i: 0 for i in range(P.LIMITS["max_map"] + 1)},
                {"a": list(range(P.LIMITS["max_array"] + 1))}):
        with pytest.raises(P.ProtocolError) as err:
            P.user_map(bad)
        assert err.value.code == 401
    assert P.user_map({"s": "x" * P.LIMITS["max_str"]})  # at the limit: fine


def test_check_body_of_some_fields_holds_just_those_to_their_rules() -> None:
    fields = {"task_id": "not an id!", "attempt": 0, "data_id": "d", "buffer_id": "b",
              "meta": {}, "payload": None}
    only = ("data_id", "buffer_id", "meta", "payload")
    P.check_body("DATA", fields, only)  # the task's fields are not looked at
    with pytest.raises(P.ProtocolError):
        P.check_body("DATA", fields)
    for bad in ({"data_id": "x" * 257}, {"meta": []}, {"payload": "str"}):
        with pytest.raises(P.ProtocolError) as err:
            P.check_body("DATA", dict(fields, **bad), only)
        assert err.value.code == 402 and next(iter(bad)) in err.value.reason


def test_committed_vectors_are_what_generate_py_writes(tmp_path: Any) -> None:
    """protocol/vectors/*.json are exactly what generate.py writes now: a change to the
    generator (a spec change) that was not followed by a rerun fails here, naming the file."""
    import subprocess
    import sys

    script = os.path.join(PROTOCOL_DIR, "vectors", "generate.py")
    subprocess.run([sys.executable, script, str(tmp_path)], check=True, timeout=120)
    names = sorted(n for n in os.listdir(tmp_path))
    assert names == ["events.json", "invalid.json", "valid.json"]
    for name in names:
        with open(os.path.join(PROTOCOL_DIR, "vectors", name), encoding="utf-8") as f:
            committed = f.read()
        with open(os.path.join(tmp_path, name), encoding="utf-8") as f:
            generated = f.read()
        assert generated == committed, (
            f"protocol/vectors/{name} differs from what generate.py writes: rerun "
            "/usr/bin/python3 protocol/vectors/generate.py")
