"""rlbus-bench's Python rows, run small: the harness starts every side (the Python SDK, the
bare pyzmq loop through the proxy, the HTTP baseline), measures each row beside its
baselines and reports nothing lost. And the topic bus's rows (`rlbus-bench bus`, which runs
bench/bus_baselines.py) from Python and C++, run for a few seconds: every row is there, with
its loss counted. And what watching the web view costs the broker (bench/web_view.py). It
checks the harnesses, never a figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD_DIR, ROOT

SCRIPT = os.path.join(ROOT, "bench", "python_bench.py")
BENCH = os.path.join(BUILD_DIR, "bench", "rlbus-bench")
BUS_SCRIPT = os.path.join(ROOT, "bench", "bus_baselines.py")
BROKER = os.path.join(BUILD_DIR, "src", "rlbus-broker")


def test_python_rows_are_measured_beside_their_baselines(tmp_path) -> None:
    if not os.access(BENCH, os.X_OK):
        pytest.skip(f"rlbus-bench not built: {BENCH}")
    out = tmp_path / "python.json"
    r = subprocess.run([sys.executable, SCRIPT, "--build", BUILD_DIR, "--quick", "--no-cpp",
                        "--collectors", "1,2", "--json", str(out), "--check"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(row["scenario"], row["params"].get("collectors")): row for row in report["rows"]}
    assert set(rows) == {("latency", None), ("throughput", 1), ("throughput", 2)}
    for row in rows.values():
        assert row["python_sdk"]["median"] > 0 and row["bare_pyzmq"]["median"] > 0
        assert row["http"] and row["http"]["median"] > 0
        assert row["ratio_bare"] == pytest.approx(
            row["python_sdk"]["median"] / row["bare_pyzmq"]["median"])
    for n in (1, 2):
        thr = rows[("throughput", n)]
        assert thr["python_sdk"]["lost"] == 0 and thr["bare_pyzmq"]["lost"] == 0
        assert thr["params"]["items_per_trial"] > 0
    # the table names every row
    assert "throughput  2 coll." in r.stdout and "latency" in r.stdout


def test_bus_rows_from_python_and_cpp_are_printed(tmp_path) -> None:
    if not os.access(BENCH, os.X_OK) or not os.access(BROKER, os.X_OK):
        pytest.skip(f"rlbus-bench or rlbus-broker not built in {BUILD_DIR}")
    out = tmp_path / "bus.json"
    env = dict(os.environ, RLBUS_BROKER=BROKER)
    r = subprocess.run([BENCH, "bus", "--smoke", "--backends", "rlbus,ditask,cpp",
                        "--json", str(out)], capture_output=True, text=True, timeout=180,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(row["backend"], row["metric"]): row for row in report["rows"]}
    every = {"rtt_64B_median", "rtt_64B_p99", "msgs_1to1", "msgs_4to1", "MBps_1MiB",
             "lost_slow_sub"}
    assert {m for b, m in rows if b == "rlbus"} == every
    assert {m for b, m in rows if b == "cpp"} == every  # --smoke: no 64 MiB row
    assert {m for b, m in rows if b == "ditask"} == {"rtt_64B_median", "rtt_64B_p99",
                                                     "msgs_1to1", "listen_s"}
    # a worker's start-up: above the floor of a process with no MQ
    start = rows[("ditask", "listen_s")]
    assert start["median"] >= start["floor_s"] > 0, start
    for (backend, metric), row in rows.items():
        assert row["median"] is not None and row["median"] >= 0, (backend, metric)
        assert "lost" in row or metric == "lost_slow_sub", (backend, metric)
        assert f"{backend:<8} {metric:<16}" in r.stdout
    for b in ("rlbus", "cpp"):  # nothing lost: every message was counted by its sequence
        assert rows[(b, "lost_slow_sub")]["median"] == 0
        assert sum(rows[(b, "msgs_4to1")]["lost"]) == 0
    # the summary and the targets name our rows
    assert "summary:" in r.stdout and "targets (reported, never asserted):" in r.stdout
    assert {t["backend"] for t in report["summary"]["targets"]} == {"rlbus", "ditask", "cpp"}
    assert "rlbus    broker rlbus-broker" in r.stdout


def test_the_web_views_cost_is_measured_beside_the_broker_alone(tmp_path) -> None:
    """bench/web_view.py, run small with the page in headless chromium: both phases measured,
    the ratios those of the medians."""
    out = tmp_path / "web.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "web_view.py"), "--smoke",
                        "--broker", BROKER, "--json", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["watcher"] == "chromium"
    rows = {row["metric"]: row for row in report["rows"]}
    assert set(rows) == {"cpu_ms_per_s", "delivered_per_s"}
    for row in rows.values():
        assert row["alone"] > 0 and row["watched"] > 0
        assert row["ratio"] == row["watched"] / row["alone"]
    assert "broker CPU ms/s" in r.stdout
