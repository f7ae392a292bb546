"""CURVE through the Python SDK (SPEC §15): both roles connect with keys and run a task, the
wire carries no plaintext (a capture is searched for a known payload, and finds it when the
same run is plain), a stranger's key is told why no WELCOME comes, a revoked key ends the
session and is served again once it is put back, and key files are checked before anything connects."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Dict, List, Optional

import pytest

import rlbus
from conftest import BROKER, Broker, wait_until
from rlbus import free_port
from relay import Relay
from rlbus.worker import Task

DEADLINE = 15.0
MARKER = b"RLBUS-SECRET-PAYLOAD-7f3a9c"


def keygen(tmp_path, stem: str) -> str:
    out = subprocess.run([BROKER, "keygen", str(tmp_path / stem)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    return str(tmp_path / stem)


def allowlist(tmp_path, entries: List[str]) -> str:
    path = tmp_path / "allow.toml"
    tmp = tmp_path / "allow.toml.new"
    tmp.write_text("\n".join(entries))
    os.replace(tmp, path)
    return str(path)


def entry(stem: str, roles: str) -> str:
    name = os.path.basename(stem)
    return f'[[key]]\nname = "{name}"\npublic-key-file = "{name}.pub"\nroles = [{roles}]\n'


@pytest.fixture
def keys(tmp_path) -> Dict[str, str]:
    return {s: keygen(tmp_path, s) for s in ("broker", "coord", "coll", "stranger")}


def curve_broker(tmp_path, keys: Dict[str, str]) -> Broker:
    allow = allowlist(tmp_path, [entry(keys["coord"], '"coordinator"'),
                                 entry(keys["coll"], '"collector"')])
    return Broker(["--curve-key", keys["broker"] + ".key", "--allowlist", allow])


class Recorder:
    def __init__(self) -> None:
        self.data: List[Dict[str, Any]] = []
        self.finished: List[str] = []

    def deal_with_collector_send_data(self, task_id, buffer_id, data_id, data) -> None:
        self.data.append(data)

    def deal_with_collector_finish_task(self, task_id, result) -> None:
        self.finished.append(task_id)


def run(task: Task) -> None:
    task.emit_data("d0", "buf", {"note": MARKER.decode()}, payload=MARKER * 4)
    task.emit_info({"collector_done": True})
    task.wait_stop(30)


def one_task(router: str, coll_curve: Optional[rlbus.CurveKeys],
             coord_curve: Optional[rlbus.CurveKeys]) -> Recorder:
    rec = Recorder()
    with rlbus.Worker(router, role="collector", id="coll-1", run=run, heartbeat=0.2,
                      curve=coll_curve) as w, \
            rlbus.Coordinator(router, id="crd", callbacks=rec, curve=coord_curve) as c:
        assert w.wait_for("ready", DEADLINE), w.last_error
        assert c.wait_for("ready", DEADLINE)
        r = c.submit("t1", "collector", {})
        assert r is not None and r.accepted, r
        assert wait_until(lambda: rec.finished == ["t1"], DEADLINE)
    return rec


def test_both_roles_connect_with_keys_and_the_wire_shows_no_plaintext(
        tmp_path, keys: Dict[str, str]) -> None:
    b = curve_broker(tmp_path, keys)
    relay = Relay(b.router_port, record=True)
    try:
        broker_pub = keys["broker"] + ".pub"
        rec = one_task(relay.endpoint,
                       rlbus.curve_keys_from_files(keys["coll"] + ".key", broker_pub),
                       rlbus.curve_keys_from_files(keys["coord"] + ".key", broker_pub))
        assert rec.data[0]["payload"] == MARKER * 4
        assert relay.captured is not None and len(relay.captured) > len(MARKER) * 8
        assert MARKER not in relay.captured
        assert b"coll-1" not in relay.captured  # not even the HELLO's id
    finally:
        relay.close()
        b.stop()


def test_the_same_run_in_plain_mode_shows_the_payload_on_the_wire(broker: Broker) -> None:
    # The counterpart of the test above: the capture would find the payload if it were there.
    relay = Relay(broker.router_port, record=True)
    try:
        one_task(relay.endpoint, None, None)
        assert relay.captured is not None and MARKER in relay.captured
    finally:
        relay.close()


def test_a_stranger_is_told_why_and_a_revoked_key_comes_back_when_it_is_put_back(
        tmp_path, keys: Dict[str, str]) -> None:
    b = curve_broker(tmp_path, keys)
    try:
        broker_pub = keys["broker"] + ".pub"
        stranger = rlbus.Worker(b.router, role="collector", id="s-1", run=run,
                                heartbeat=0.2,
                                curve=rlbus.curve_keys_from_files(keys["stranger"] + ".key",
                                                                  broker_pub))
        member = rlbus.Worker(b.router, role="collector", id="m-1", run=run, heartbeat=0.2,
                              reconnect_max=0.3,  # its retries after a revocation
                              curve=rlbus.curve_keys_from_files(keys["coll"] + ".key",
                                                                broker_pub))
        with stranger, member:
            assert member.wait_for("ready", DEADLINE)
            assert wait_until(lambda: "not in its allowlist" in stranger.last_error, DEADLINE), \
                stranger.last_error
            assert stranger.state != "ready"
            allowlist(tmp_path, [entry(keys["coord"], '"coordinator"')])  # coll revoked
            assert wait_until(lambda: "431" in member.last_error, DEADLINE), member.last_error
            assert member.state not in ("ready", "refused")
            # the operator undoes it: the worker is served again without a restart
            allowlist(tmp_path, [entry(keys["coord"], '"coordinator"'),
                                 entry(keys["coll"], '"collector"')])
            assert member.wait_for("ready", DEADLINE), member.last_error
    finally:
        b.stop()


def test_insecure_with_only_the_metrics_beyond_loopback_says_so() -> None:
    """SPEC §15.1: --insecure with any socket reachable from other machines logs a warning,
    the metrics endpoint included."""
    port = free_port()
    b = Broker(["--insecure", "--metrics-port", str(port), "--metrics-address", "0.0.0.0"])
    try:
        assert wait_until(lambda: any("--insecure: serving other machines" in line
                                      and f"0.0.0.0:{port}" in line for line in b.lines), 10), \
            "".join(b.lines)
    finally:
        b.stop()


def test_key_files_are_checked_before_anything_connects(tmp_path, keys: Dict[str, str]) -> None:
    pub = keys["broker"] + ".pub"
    with pytest.raises(ValueError, match="no secret-key"):
        rlbus.curve_keys_from_files(keys["coll"] + ".pub", pub)
    with pytest.raises(ValueError, match="cannot read"):
        rlbus.curve_keys_from_files(str(tmp_path / "missing.key"), pub)
    os.chmod(keys["coll"] + ".key", 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        rlbus.curve_keys_from_files(keys["coll"] + ".key", pub)
    os.chmod(keys["coll"] + ".key", 0o600)
    k = rlbus.curve_keys_from_files(keys["coll"] + ".key", pub)
    with pytest.raises(ValueError, match="not the public key"):
        rlbus.CurveKeys(k.server_key, k.secret_key, k.server_key)
    with pytest.raises(ValueError, match="40 Z85"):
        rlbus.CurveKeys("short", k.secret_key, k.server_key)
    with pytest.raises(ValueError, match="curve"):
        rlbus.Worker("tcp://127.0.0.1:1", role="collector", id="x", run=run, curve="keys")


def test_bus_nodes_need_the_bus_role_and_keep_to_their_topic_prefixes(tmp_path) -> None:
    """SPEC §15.3, §17.8: a key's `topics` bound what its nodes publish and subscribe to."""
    keys = {s: keygen(tmp_path, s) for s in ("broker", "ditask", "coll")}
    allow = allowlist(tmp_path, [
        entry(keys["ditask"], '"bus"') + 'topics = ["task.", "model_exchanger"]\n',
        entry(keys["coll"], '"collector"')])
    broker = Broker(["--curve-key", keys["broker"] + ".key", "--allowlist", allow])
    curve = {s: rlbus.curve_keys_from_files(keys[s] + ".key", keys["broker"] + ".pub")
             for s in ("ditask", "coll")}
    try:
        a = rlbus.Bus(broker.router, "node-a", curve=curve["ditask"])
        b = rlbus.Bus(broker.router, "node-b", curve=curve["ditask"])
        stranger = rlbus.Bus(broker.router, "node-c", curve=curve["coll"])
        try:
            assert a.wait_ready(DEADLINE) and b.wait_ready(DEADLINE), a.last_error
            b.subscribe("task.", prefix=True)
            with pytest.raises(rlbus.BusError) as e:
                b.subscribe("", prefix=True)  # every topic: more than the key may
            assert e.value.code == 431
            a.publish("secrets", b"refused")       # ERROR 431, delivered to nobody
            a.publish("task.finish", b"allowed")
            got = b.recv(timeout=DEADLINE)
            assert got is not None and got.payload == b"allowed"
            assert wait_until(lambda: a.errors == 1, DEADLINE)
            # a key without the role bus gets no session as a node
            assert wait_until(lambda: stranger.state == "refused" or "431" in stranger.last_error,
                              DEADLINE), stranger.state
        finally:
            for n in (a, b, stranger):
                n.close(2)
    finally:
        broker.stop()
