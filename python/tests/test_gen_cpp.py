"""protocol/gen_cpp.py, which writes the C++ codec's message model from messages.json: what a
field of the model becomes in C++, that a field added to messages.json reaches the C++ tables
with no other edit, and that a model it cannot translate stops the build with a clear error.
(The C++ model test then checks the generated tables against messages.json, rule by rule.)"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from typing import Any, Dict

from conftest import PROTOCOL_DIR

GENERATOR = os.path.join(PROTOCOL_DIR, "gen_cpp.py")

with open(os.path.join(PROTOCOL_DIR, "messages.json"), encoding="utf-8") as _f:
    DOC = json.load(_f)


def generate(tmp_path: Any, model: Dict[str, Any]) -> subprocess.CompletedProcess:
    src = tmp_path / "messages.json"
    src.write_text(json.dumps(model), encoding="utf-8")
    return subprocess.run([sys.executable, GENERATOR, str(src), str(tmp_path / "model.hpp")],
                          capture_output=True, text=True, timeout=60)


def struct_of(text: str, name: str) -> str:
    start = text.index(f"\nstruct {name} {{")
    return text[start:text.index("\n};", start)]


def test_every_message_and_event_body_becomes_a_struct(tmp_path: Any) -> None:
    r = generate(tmp_path, DOC)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "model.hpp").read_text(encoding="utf-8")
    for m in DOC["messages"]:
        assert f"  {m['name'].lower()} = 0x{m['id']:02X}," in text
        if m.get("transport") == "pub":
            continue
        body = struct_of(text, m.get("cpp_name", m["name"].lower()))
        assert f"static constexpr msg_type type = msg_type::{m['name'].lower()};" in body
        for f in m["fields"]:
            assert f'f("{f["name"]}", s.' in body
    for e in DOC["events"]:
        struct_of(text, e["cpp_name"])
    for c in DOC["error_codes"]:
        assert f"  {c['name'].lower()} = {c['code']}," in text


def test_a_field_added_to_the_model_is_in_the_cpp_table(tmp_path: Any) -> None:
    model = copy.deepcopy(DOC)
    ack = next(m for m in model["messages"] if m["name"] == "BUS_ACK")
    ack["fields"].append({"name": "window_hint", "type": "uint", "required": False,
                          "min": 1, "max": 4096})
    r = generate(tmp_path, model)
    assert r.returncode == 0, r.stderr
    body = struct_of((tmp_path / "model.hpp").read_text(encoding="utf-8"), "bus_ack")
    # an optional member, smallest type that holds the range, read and written with its range
    assert "std::optional<std::uint32_t> window_hint;" in body
    assert 'f("window_hint", s.window_hint, rule::range{1, 4096});' in body
    # after the fields already there, in the model's order
    assert body.index('f("seq"') < body.index('f("window_hint"')


def test_types_and_defaults_follow_the_model(tmp_path: Any) -> None:
    r = generate(tmp_path, DOC)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "model.hpp").read_text(encoding="utf-8")
    error = struct_of(text, "error")
    assert "std::uint16_t code = 0;" in error  # 0..65535: the whole of a uint16
    assert "std::optional<std::uint8_t> ref_type;" in error
    publish = struct_of(text, "publish")
    assert 'f("part", s.part, rule::range{0, 4294967295U}, rule::flag{});' in publish
    assert "bool more = false;" in publish and 'f("more", s.more, rule::flag{});' in publish
    # a default-made message is a valid one: the smallest value each range allows
    assert "std::uint64_t seq = 1;" in struct_of(text, "task_event")
    # INFO's `info` cannot be a member of a struct named info: it is `body`
    assert 'f("info", s.body, rule::shape::map);' in struct_of(text, "info")
    assert 'f("info", s.info, rule::shape::relayed_map);' in struct_of(text, "learn_info")
    # the rules that tie fields together
    assert "exactly one of 'ref' and 'params'" in struct_of(text, "policy")


def test_a_model_it_cannot_translate_is_refused_with_the_field_named(tmp_path: Any) -> None:
    model = copy.deepcopy(DOC)
    model["messages"][0]["fields"].append({"name": "odd", "type": "float", "required": True})
    r = generate(tmp_path, model)
    assert r.returncode == 1
    assert "hello.odd: unknown type float" in r.stderr
    assert not (tmp_path / "model.hpp").exists()


def test_the_defaults_header_holds_the_models_defaults(tmp_path: Any) -> None:
    src = tmp_path / "messages.json"
    src.write_text(json.dumps(DOC), encoding="utf-8")
    out = tmp_path / "defaults.hpp"
    r = subprocess.run([sys.executable, GENERATOR, "--defaults", str(src), str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = out.read_text(encoding="utf-8")
    assert DOC["defaults"]["router_endpoint"] == "tcp://127.0.0.1:7235"  # as SPEC §2.3 says
    for key, value in DOC["defaults"].items():
        if isinstance(value, str):
            assert f'{key} = "{value}";' in text
        elif key.endswith("_ms"):
            assert f"std::chrono::milliseconds {key[:-3]}{{{value}}};" in text
        else:
            assert f"std::size_t {key} = {value};" in text


def test_the_python_sdk_takes_the_same_defaults() -> None:
    import inspect

    import rlbus
    from rlbus._session import Session
    from rlbus.bus import Bus
    from rlbus.coordinator import Coordinator
    from rlbus.worker import Worker
    d = DOC["defaults"]
    assert rlbus.DEFAULT_ENDPOINT == d["router_endpoint"]
    for cls, reconnect_max in ((Worker, d["reconnect_max_ms"]),
                               (Coordinator, d["reconnect_max_ms"]),
                               (Bus, d["bus_reconnect_max_ms"])):
        params = inspect.signature(cls.__init__).parameters
        assert params["reconnect_min"].default == d["reconnect_min_ms"] / 1000
        assert params["reconnect_max"].default == reconnect_max / 1000
    assert inspect.signature(Coordinator.__init__).parameters["endpoint"].default is None
    # None is the default endpoint, as the C++ SDK's options left unset
    s = Session(None, "coordinator", "c", on_state=lambda *a: None,
                on_welcome=lambda m: None, on_message=None)
    assert s.endpoint == d["router_endpoint"]
    assert s.heartbeat_ms == d["heartbeat_ms"]
