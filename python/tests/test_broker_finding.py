"""How the package finds and starts a broker: rlbus.find_broker() ($RLBUS_BROKER, PATH, a
build tree), rlbus.Broker (free ports, the same ones again after a kill), rlbus.free_port, and
`python3 -m rlbus`, which says what it found, as a new user would run it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import BROKER, PYTHON_DIR, wait_until
import rlbus
from rlbus import Bus


def _fake_binary(folder) -> str:
    path = os.path.join(str(folder), "rlbus-broker")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)
    return path


def test_the_broker_named_by_the_environment_comes_first(tmp_path, monkeypatch) -> None:
    fake = _fake_binary(tmp_path)
    monkeypatch.setenv("RLBUS_BROKER", fake)
    assert rlbus.find_broker() == fake


def test_a_broker_named_but_missing_is_an_error_not_a_fallback(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLBUS_BROKER", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="RLBUS_BROKER names .*nowhere"):
        rlbus.find_broker()


def test_path_comes_before_a_build_tree(tmp_path, monkeypatch) -> None:
    fake = _fake_binary(tmp_path)
    monkeypatch.delenv("RLBUS_BROKER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    assert rlbus.find_broker() == fake


def _module_cli(env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlbus"], capture_output=True, text=True,
                          env=env, cwd=str(cwd), timeout=60)


def test_python_m_rlbus_names_the_version_the_broker_and_the_endpoint(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, RLBUS_BROKER=BROKER,
               RLBUS_ENDPOINT="tcp://broker.example:7235")
    r = _module_cli(env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"rlbus {rlbus.__version__} ")
    assert f"broker binary: {BROKER}" in r.stdout
    assert "endpoint: tcp://broker.example:7235 ($RLBUS_ENDPOINT)" in r.stdout


def test_python_m_rlbus_says_where_it_looked_when_there_is_no_broker(tmp_path) -> None:
    # a copy of the package away from any build tree, and a PATH without a broker
    shutil.copytree(os.path.join(PYTHON_DIR, "rlbus"), tmp_path / "pkg" / "rlbus")
    shutil.copyfile(os.path.join(os.path.dirname(PYTHON_DIR), "VERSION"),
                    tmp_path / "pkg" / "rlbus" / "VERSION")  # as setup.py puts it in
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLBUS_")}
    env.update(PYTHONPATH=str(tmp_path / "pkg"), PATH="/usr/bin:/bin",
               RLBUS_MESSAGES_JSON=os.path.join(os.path.dirname(PYTHON_DIR), "protocol",
                                                "messages.json"))
    r = _module_cli(env, tmp_path)
    assert r.returncode == 1
    assert "broker binary: none: no rlbus-broker binary found; tried:" in r.stdout
    assert "install the broker on PATH" in r.stdout
    assert "endpoint: tcp://127.0.0.1:7235" in r.stdout


def test_a_killed_broker_comes_back_on_the_same_endpoints() -> None:
    with rlbus.Broker(binary=BROKER) as b:
        router = b.router
        assert not router.endswith(":0")
        node = Bus(router, "finding-node")
        try:
            assert node.wait_ready(10)
            b.kill()
            assert not b.running
            b.start()
            assert b.router == router
            # the node notices the silence, dials the same place, and gets a new session
            assert wait_until(lambda: node.sessions_lost == 1 and node.state == "ready", 30)
        finally:
            node.close(2)
    assert not b.running


def test_free_port_gives_ports_a_broker_can_bind_below_the_ephemeral_range() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports = {rlbus.free_port() for _ in range(20)}
    assert all(10000 <= p < min(low, 30000) for p in ports)
    assert len(ports) > 1  # drawn, not one fixed port
    port = ports.pop()
    with rlbus.Broker(binary=BROKER, router=f"tcp://127.0.0.1:{port}") as b:
        assert b.router == f"tcp://127.0.0.1:{port}"
