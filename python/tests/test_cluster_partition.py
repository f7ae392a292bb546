"""A group's leader cut off from etcd but not from its peers, with network namespaces.

etcd runs in a namespace of its own (E), broker a in another (A); broker b, the coordinator
and the worker run here. A reaches etcd over a link of its own (A-E); b reaches it over
another (here-E); the peers and b reach a over a third (here-A). Cutting A-E takes etcd from a
alone: a can no longer renew its lease, so it stops serving before the lease can run out, and
b takes over once etcd has dropped it. Two leaders never serve at once: a's log says it
stopped before b's says it leads. Every task finishes exactly once. Skipped without root,
iproute2's ip or etcd.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from datetime import datetime
from typing import Iterator, List

import pytest

from conftest import BROKER, ETCD, Process, wait_until
from test_cluster import collector_and_coordinator


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


class Topology:
    """Namespaces E (etcd) and A (broker a) and three veth links: here-E, here-A and A-E."""

    def __init__(self) -> None:
        pid = os.getpid()
        n = pid % 200 + 20
        self.e, self.a = f"rlbus-e{pid}", f"rlbus-a{pid}"
        self.links: List[str] = []
        sh("ip", "netns", "add", self.e)
        sh("ip", "netns", "add", self.a)
        try:
            # name here/there, address here/there (/30 each)
            self.here_e = self.link(f"rhe{pid % 100000}", None, f"reh{pid % 100000}", self.e,
                                    f"10.214.{n}.1", f"10.214.{n}.2")
            self.here_a = self.link(f"rha{pid % 100000}", None, f"rah{pid % 100000}", self.a,
                                    f"10.215.{n}.1", f"10.215.{n}.2")
            self.a_e = self.link(f"rae{pid % 100000}", self.a, f"rea{pid % 100000}", self.e,
                                 f"10.216.{n}.1", f"10.216.{n}.2")
            for ns in (self.e, self.a):
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.close()
            raise

    def link(self, near: str, near_ns: object, far: str, far_ns: str, near_ip: str,
             far_ip: str) -> tuple:
        sh("ip", "link", "add", near, "type", "veth", "peer", "name", far)
        self.links.append(near)
        if near_ns is not None:
            sh("ip", "link", "set", near, "netns", str(near_ns))
        sh("ip", "link", "set", far, "netns", far_ns)
        here = [] if near_ns is None else ["-n", str(near_ns)]
        sh("ip", *here, "addr", "add", f"{near_ip}/30", "dev", near)
        sh("ip", *here, "link", "set", near, "up")
        sh("ip", "-n", far_ns, "addr", "add", f"{far_ip}/30", "dev", far)
        sh("ip", "-n", far_ns, "link", "set", far, "up")
        return near, near_ns, near_ip, far_ip

    def cut_a_from_etcd(self) -> None:
        name, ns, _, _ = self.a_e
        sh("ip", "-n", str(ns), "link", "set", name, "down")

    def heal(self) -> None:
        name, ns, _, _ = self.a_e
        sh("ip", "-n", str(ns), "link", "set", name, "up")

    def close(self) -> None:
        for name in self.links:
            sh("ip", "link", "del", name, check=False)
        sh("ip", "netns", "del", self.a, check=False)
        sh("ip", "netns", "del", self.e, check=False)


@pytest.fixture
def topology() -> Iterator[Topology]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    if not os.path.exists(BROKER):
        pytest.skip(f"broker binary not built: {BROKER}")
    try:
        t = Topology()
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    try:
        yield t
    finally:
        t.close()


def logged_at(p: Process, text: str) -> datetime:
    """The time a broker's log line that holds `text` starts with."""
    line = next(x for x in p.lines if text in x)
    stamp = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})", line)
    assert stamp, line
    return datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S.%f")


def test_a_leader_cut_off_from_etcd_stops_before_the_standby_leads(topology: Topology) -> None:
    t = topology
    _, _, here_e, e_here = t.here_e
    _, _, here_a, a_here = t.here_a
    _, _, a_e, e_a = t.a_e
    procs: List[Process] = []
    opened: list = []
    with tempfile.TemporaryDirectory() as d:
        try:
            etcd = Process(["ip", "netns", "exec", t.e, ETCD, "--name", "p",
                            "--data-dir", os.path.join(d, "etcd"),
                            "--listen-client-urls", "http://0.0.0.0:2379",
                            "--advertise-client-urls", f"http://{e_here}:2379",
                            "--listen-peer-urls", "http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                            "--initial-cluster", "p=http://127.0.0.1:2380"])
            procs.append(etcd)

            def healthy() -> bool:
                try:
                    with urllib.request.urlopen(f"http://{e_here}:2379/health", timeout=2) as r:
                        return b'"true"' in r.read()
                except OSError:
                    return False
            assert wait_until(healthy, 60, 0.1), "".join(etcd.lines)

            def broker(name: str, router: str, etcd_url: str, ns: str = "") -> Process:
                prefix = ["ip", "netns", "exec", ns] if ns else []
                return Process(prefix + [
                    BROKER, "--router", router, "--advertise", router,
                    "--events", f"{router.rsplit(':', 1)[0]}:0", "--insecure",
                    "--cluster-etcd", etcd_url, "--cluster-name", "p", "--cluster-member", name,
                    "--journal", os.path.join(d, f"{name}.journal")])
            a_router, b_router = f"tcp://{a_here}:7301", f"tcp://{here_a}:7302"
            a = broker("a", a_router, f"http://{e_a}:2379", t.a)
            procs.append(a)
            a.wait_for("rlbus-broker listening")
            b = broker("b", b_router, f"http://{e_here}:2379")
            procs.append(b)
            a.wait_for("in sync now: a, b")

            both = f"{a_router},{b_router}"
            finished: List[str] = []
            w, c = collector_and_coordinator(both, finished, step=0.1)
            opened += [w, c]
            assert wait_until(lambda: c.state == "ready", 30), c.last_error
            tasks = [f"t{k}" for k in range(20)]
            for task_id in tasks:
                assert c.submit(task_id, "collector").accepted
            assert wait_until(lambda: len(finished) >= 3, 60), c.last_error

            t.cut_a_from_etcd()  # a keeps its peers and b; it loses etcd
            a.wait_for("no longer the group's leader")
            b.wait_for("leading group p")
            # a stopped serving before b could lead: its lease had not run out in etcd then.
            assert logged_at(a, "no longer the group's leader") < logged_at(b, "leading group p")
            assert wait_until(lambda: len(set(finished)) == len(tasks), 60), \
                (sorted(set(tasks) - set(finished)), c.last_error)
            assert sorted(finished) == sorted(tasks)  # each once
            t.heal()
            a.wait_for("standing by: b leads group p")  # back in touch: it follows b
        finally:
            for x in reversed(opened):
                x.close()
            for p in reversed(procs):
                p.stop()
