#!/usr/bin/python3
"""What watching the broker costs it: its CPU and the traffic it carries, with nobody looking
and with its web view open, in alternating phases of one run. Nothing here asserts a timing.

The broker (this build's, or --broker, or $RLBUS_BROKER) serves, for the whole run:
  - --workers idle worker sessions (raw DEALERs that only beat), so the page's tables are
    those of a fleet and each answer of the loop pages through it;
  - a steady flow through the loop: two bus nodes, one publishing 256 B as fast as the
    broker's credit lets it, the other reading.
Phases of --seconds each alternate, --trials of each:
  alone     nobody watches;
  watched   the web view is open in headless chromium (chromium-driver and python3-selenium),
            reading /api/view twice a second and /api/series once a second as it does for
            a person; with --watcher http (or no chromium), a thread asks the same URLs
            at the same rates instead.
For each phase: the broker's CPU (user + system, from /proc, all its threads) per second of
wall time, and the bus deliveries per second. The table gives the medians and the ratios
watched / alone.

usage: bench/web_view.py [--workers N] [--seconds S] [--trials T] [--watcher chromium|http]
                         [--json FILE] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import zmq  # noqa: E402

import rlbus  # noqa: E402
from rlbus import protocol as P  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class IdleFleet:
    """`n` worker sessions that only beat, on raw DEALERs of one context, from one thread."""

    def __init__(self, endpoint: str, n: int) -> None:
        self.ctx = zmq.Context()
        self.socks = []
        for i in range(n):
            s = self.ctx.socket(zmq.DEALER)
            s.linger = 0
            s.connect(endpoint)
            s.send_multipart(list(P.encode("HELLO", {
                "role": "collector" if i % 8 else "learner", "id": f"idle-{i}",
                "heartbeat_ms": 10000, "resources": {"cpu": 1}})))
            self.socks.append(s)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        beat = list(P.encode("HEARTBEAT", {}))
        while not self.stop.wait(3.0):
            for s in self.socks:
                while s.poll(0):
                    s.recv_multipart()
                s.send_multipart(beat)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.socks:
            s.send_multipart(list(P.encode("DISCONNECT", {"code": 200, "reason": "bench over"})))
            s.close()
        self.ctx.term()


class Flow:
    """One node publishing 256 B as fast as credit allows, another reading: `delivered`."""

    def __init__(self, endpoint: str) -> None:
        self.pub = rlbus.Bus(endpoint, id="flow-pub")
        self.sub = rlbus.Bus(endpoint, id="flow-sub")
        self.sub.subscribe("flow")
        self.delivered = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._publish, daemon=True),
                        threading.Thread(target=self._read, daemon=True)]
        for t in self.threads:
            t.start()

    def _publish(self) -> None:
        payload = b"x" * 256
        while not self.stop.is_set():
            try:
                self.pub.publish("flow", payload, timeout=5.0)
            except TimeoutError:
                continue

    def _read(self) -> None:
        while not self.stop.is_set():
            if self.sub.recv(timeout=0.2) is not None:
                self.delivered += 1

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        self.pub.close()
        self.sub.close()


class HttpWatcher:
    """Asks what the page asks, at its rates."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        after = 0
        next_series = 0.0
        while not self.stop.wait(0.5):
            with urllib.request.urlopen(self.url + "/api/view", timeout=10) as r:
                r.read()
            if time.monotonic() >= next_series:
                next_series = time.monotonic() + 1.0
                with urllib.request.urlopen(f"{self.url}/api/series?after={after}",
                                            timeout=10) as r:
                    samples = json.loads(r.read())["samples"]
                if samples:
                    after = samples[-1][0]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class ChromiumWatcher:
    """The page itself, in headless chromium."""

    def __init__(self, url: str) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        options = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"),
                                       options=options)
        self.driver.get(url + "/")

    def close(self) -> None:
        self.driver.quit()


def chromium_available() -> bool:
    import importlib.util
    return (importlib.util.find_spec("selenium") is not None
            and os.path.exists("/usr/bin/chromedriver"))


def measure(pid: int, flow: Optional[Flow], seconds: float) -> Dict[str, float]:
    cpu0, n0, t0 = cpu_seconds(pid), flow.delivered if flow else 0, time.monotonic()
    time.sleep(seconds)
    cpu1, n1, t1 = cpu_seconds(pid), flow.delivered if flow else 0, time.monotonic()
    return {"cpu_ms_per_s": (cpu1 - cpu0) * 1000 / (t1 - t0),
            "delivered_per_s": (n1 - n0) / (t1 - t0)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1000, help="idle worker sessions (1000)")
    ap.add_argument("--seconds", type=float, default=10.0, help="each phase's length (10)")
    ap.add_argument("--trials", type=int, default=5, help="phases of each kind (5)")
    ap.add_argument("--watcher", choices=("chromium", "http"), default="chromium",
                    help="the page in headless chromium (default), or a thread asking its URLs")
    ap.add_argument("--broker", help="the rlbus-broker binary (default: as rlbus.find_broker)")
    ap.add_argument("--no-flow", action="store_true",
                    help="no bus flow: what the page costs a broker that has nothing else to do")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--smoke", action="store_true",
                    help="50 workers, 1 s phases, 1 trial: checks the harness, measures nothing")
    a = ap.parse_args(argv)
    if a.smoke:
        a.workers, a.seconds, a.trials = 50, 1.0, 1
    watcher = a.watcher
    if watcher == "chromium" and not chromium_available():
        print("web_view: no chromium-driver or python3-selenium: the watcher asks the page's "
              "URLs itself (--watcher http)", file=sys.stderr)
        watcher = "http"
    port = rlbus.free_port()
    broker = rlbus.Broker(["--metrics-port", str(port), "--log-level", "warn"],
                          binary=a.broker)
    broker.start()
    url = f"http://127.0.0.1:{port}"
    assert broker.proc is not None
    pid = broker.proc.pid
    fleet = IdleFleet(broker.router, a.workers)
    flow = None if a.no_flow else Flow(broker.router)
    rows: Dict[str, List[Dict[str, float]]] = {"alone": [], "watched": []}
    try:
        time.sleep(min(2.0, a.seconds))  # sessions made, the flow under way
        for trial in range(a.trials):
            rows["alone"].append(measure(pid, flow, a.seconds))
            w: Any = ChromiumWatcher(url) if watcher == "chromium" else HttpWatcher(url)
            try:
                time.sleep(min(2.0, a.seconds))  # the page loaded and reading
                rows["watched"].append(measure(pid, flow, a.seconds))
            finally:
                w.close()
            print(f"trial {trial + 1}/{a.trials}: alone {rows['alone'][-1]}, "
                  f"watched {rows['watched'][-1]}", file=sys.stderr)
    finally:
        if flow:
            flow.close()
        fleet.close()
        broker.stop()
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in rows.items()}
    print(f"\nweb view cost: {a.workers} idle workers, "
          f"{'no bus flow' if a.no_flow else 'a bus flow of 256 B'}, watcher {watcher}, "
          f"{a.trials} x {a.seconds:g} s per phase, medians")
    print(f"{'metric':<22}{'alone':>12}{'watched':>12}{'watched/alone':>15}")
    out = []
    metrics = [("cpu_ms_per_s", "broker CPU ms/s")]
    if not a.no_flow:
        metrics.append(("delivered_per_s", "bus msgs/s"))
    for m, unit in metrics:
        alone, watched = med["alone"][m], med["watched"][m]
        ratio = watched / alone if alone else float("nan")
        print(f"{unit:<22}{alone:>12.1f}{watched:>12.1f}{ratio:>15.2f}")
        out.append({"metric": m, "alone": alone, "watched": watched, "ratio": ratio})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workers": a.workers, "seconds": a.seconds, "trials": a.trials,
                       "watcher": watcher, "flow": not a.no_flow, "rows": out,
                       "trials_raw": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
