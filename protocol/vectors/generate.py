#!/usr/bin/python3
"""Writes the protocol v1 golden vectors (valid.json, invalid.json, events.json).

The bytes come from Python's msgpack, an encoder independent of the C++ codec, with every
map written in the canonical field order of SPEC.md §4/§7. Every client's tests decode
these bytes, compare the meaning, and re-encode them byte for byte. Rerun after a spec
change (needs Debian's python3-msgpack):  /usr/bin/python3 protocol/vectors/generate.py
"""
import json
import os

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
TYPES = {"HELLO": 0x01, "WELCOME": 0x02, "HEARTBEAT": 0x03, "DISCONNECT": 0x04,
         "ERROR": 0x05, "EVENT": 0x60}


def header(type_id, version=1, sig=b"RL"):
    return (sig + bytes([version, type_id])).hex()


def pack(fields):
    return msgpack.packb(fields, use_bin_type=True).hex()


def valid(name, type_name, fields, note):
    return {"name": name, "type": type_name, "note": note,
            "header_hex": header(TYPES[type_name]), "body_hex": pack(fields), "fields": fields}


VALID = [
    valid("hello_collector_minimal", "HELLO",
          {"role": "collector", "id": "collector-0", "heartbeat_ms": 1000, "resources": {}},
          "a collector with no announced resources"),
    valid("hello_learner_resources", "HELLO",
          {"role": "learner", "id": "learner-0.rl-ns:22271", "heartbeat_ms": 500,
           "resources": {"cpu": 4, "gpu": 1, "memory_gb": 15.5}},
          "resources sorted by name; whole numbers as integers, others as float64"),
    valid("hello_resume", "HELLO",
          {"role": "collector", "id": "collector-7", "heartbeat_ms": 1000, "resources": {"cpu": 2},
           "session": 0x1122334455667788},
          "a reconnecting peer resumes its session with the token from WELCOME"),
    valid("hello_coordinator", "HELLO",
          {"role": "coordinator", "id": "coordinator", "heartbeat_ms": 250, "resources": {}},
          "coordinators introduce themselves the same way"),
    valid("welcome_new", "WELCOME",
          {"session": 0xfedcba9876543210, "epoch": 0x0123456789abcdef, "heartbeat_ms": 1000,
           "liveness": 3, "max_message": 1048576, "resumed": False},
          "a fresh session"),
    valid("welcome_resumed", "WELCOME",
          {"session": 0x1122334455667788, "epoch": 42, "heartbeat_ms": 100, "liveness": 5,
           "max_message": 65536, "resumed": True},
          "the session moved to this connection"),
    valid("heartbeat", "HEARTBEAT", {}, "an empty map"),
    valid("disconnect_goodbye", "DISCONNECT", {"code": 200, "reason": "worker stopping"},
          "an orderly leave"),
    valid("disconnect_expired", "DISCONNECT",
          {"code": 410, "reason": "no message within the liveness window"},
          "the broker expired the session"),
    valid("error_not_ready", "ERROR",
          {"code": 403, "reason": "introduce yourself with HELLO first", "ref_type": 3},
          "a HEARTBEAT before HELLO"),
    valid("error_bad_frame", "ERROR",
          {"code": 400, "reason": "header frame must be 4 bytes"},
          "no ref_type when the type could not be read"),
]


def invalid(name, body_hex, code, note, type_name="HELLO"):
    return {"name": name, "type": type_name, "note": note, "header_hex": header(TYPES[type_name]),
            "body_hex": body_hex, "error_code": code}


GOOD = {"role": "collector", "id": "c0", "heartbeat_ms": 1000, "resources": {}}


def without(key):
    return pack({k: v for k, v in GOOD.items() if k != key})


def with_field(key, value):
    d = dict(GOOD)
    d[key] = value
    return pack(d)


deep = 0
for _ in range(40):
    deep = [deep]

INVALID = [
    invalid("array32_bomb", "dd1e1e1e1e1e", 401,
            "an array32 header claiming 505 million elements: must not allocate"),
    invalid("map32_bomb", "df7fffffff", 401, "a map32 header claiming 2^31 entries"),
    invalid("empty_body", "", 401, "no bytes at all"),
    invalid("truncated_map", pack(GOOD)[:-4], 401, "the last two bytes are missing"),
    invalid("trailing_bytes", pack(GOOD) + "c0", 401, "a nil after the map"),
    invalid("not_a_map", pack(["collector", "c0", 1000]), 401, "an array instead of a map"),
    invalid("non_string_key", "81" + "01" + "a178", 401, "{1: 'x'}"),
    invalid("duplicate_key", "82" + "a2" + b"id".hex() + "a161" + "a2" + b"id".hex() + "a162",
            401, "{'id': 'a', 'id': 'b'}"),
    invalid("ext_type", "81" + "a178" + "d40100", 401, "an ext value (fixext1)"),
    invalid("too_deep", with_field("extra", deep), 401, "an unknown field nested 40 deep"),
    invalid("missing_id", without("id"), 402, "HELLO without id"),
    invalid("missing_role", without("role"), 402, "HELLO without role"),
    invalid("role_wrong_type", with_field("role", 1), 402, "role is an integer"),
    invalid("role_unknown", with_field("role", "trainer"), 402, "no such role"),
    invalid("id_bad_chars", with_field("id", "bad id!"), 402, "space and ! are not allowed"),
    invalid("id_empty", with_field("id", ""), 402, "ids are 1-128 characters"),
    invalid("id_too_long", with_field("id", "x" * 129), 402, "ids are 1-128 characters"),
    invalid("heartbeat_too_small", with_field("heartbeat_ms", 5), 402, "below 10 ms"),
    invalid("heartbeat_negative", with_field("heartbeat_ms", -1), 402, "a negative integer"),
    invalid("heartbeat_float", with_field("heartbeat_ms", 1000.0), 402, "a float"),
    invalid("resource_negative", with_field("resources", {"cpu": -1}), 402, "negative"),
    invalid("resource_not_number", with_field("resources", {"cpu": "4"}), 402, "a string"),
    invalid("resource_nan", with_field("resources", {"cpu": float("nan")}), 402, "NaN"),
    invalid("too_many_resources",
            with_field("resources", {f"r{i:02d}": 1 for i in range(33)}), 402, "33 entries"),
    invalid("session_zero", with_field("session", 0), 402, "tokens are never 0"),
    invalid("disconnect_no_code", pack({"reason": "bye"}), 402, "DISCONNECT without code",
            "DISCONNECT"),
    invalid("event_type_on_router", pack({}), 404, "EVENT is never a ROUTER message", "EVENT"),
]


def event(name, topic, fields, note):
    return {"name": name, "topic": topic, "note": note, "header_hex": header(TYPES["EVENT"]),
            "body_hex": pack(fields), "fields": fields}


def envelope(seq):
    return {"seq": seq, "epoch": 0x0123456789abcdef, "ts_ms": 1796000000000}


EVENTS = [
    event("worker_joined", "worker.joined",
          {**envelope(1), "id": "collector-0", "role": "collector", "serial": 1,
           "resources": {"cpu": 4}, "resumed": False}, "a new collector"),
    event("worker_joined_resumed", "worker.joined",
          {**envelope(2), "id": "learner-0", "role": "learner", "serial": 2,
           "resources": {"gpu": 1}, "resumed": True}, "a learner resumed its session"),
    event("worker_lost", "worker.lost",
          {**envelope(3), "id": "collector-0", "role": "collector", "serial": 1, "code": 410,
           "reason": "no message within the liveness window"}, "expired"),
    event("coordinator_left", "coordinator.left",
          {**envelope(4), "id": "coordinator", "role": "coordinator", "serial": 3, "code": 200,
           "reason": "done"}, "an orderly leave"),
    event("broker_heartbeat", "broker.heartbeat",
          {**envelope(5), "peers": 12, "uptime_ms": 60000}, "periodic status"),
    event("broker_stopping", "broker.stopping", {**envelope(6), "drain_ms": 0}, "shutdown"),
    event("unknown_topic", "future.topic", envelope(7),
          "a topic this version does not know: the envelope still decodes"),
]


def write(name, items):
    with open(os.path.join(HERE, name), "w") as f:
        json.dump({"protocol": "rlbus", "version": 1, "vectors": items}, f, indent=1)
        f.write("\n")


write("valid.json", VALID)
write("invalid.json", INVALID)
write("events.json", EVENTS)
