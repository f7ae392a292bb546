"""The topic bus under nodes that do not play along (SPEC §17.4.2, §17.6, §17.2.3): a node holds
back only the publishers whose publications sit in its queue, and only for bus-stall-timeout
while it acknowledges nothing; when the bus as a whole runs short, the nodes holding more than
their share pay, not the ones that keep up; what the bus holds is counted as it is held, so the
broker's RSS stays within its bounds; and a fragment never reaches a later session of its
recipient's id. Each scenario runs a real broker with bare DEALERs as the misbehaving nodes."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional

import pytest
import zmq

import rlbus
from conftest import BUILD_DIR, wait_until
from test_bus import _node
from test_bus_wire import Node, pub
from test_limits import rss_mib
from test_security import allowlist, entry, keygen

MiB = 1024 * 1024

# How long rlbus-ctl waits for the broker: a broker on a busy machine, holding much, may
# take seconds to answer, and its answer is what the tests look at.
CTL_TIMEOUT_MS = "30000"


def topics_view(router: str, curve_args: Optional[List[str]] = None) -> Dict[str, Any]:
    """OPS `topics` as rlbus-ctl shows it (--json)."""
    out = subprocess.run([os.path.join(BUILD_DIR, "src", "rlbus-ctl"),
                          "--timeout", CTL_TIMEOUT_MS, "--broker", router,
                          *(curve_args or []), "--json", "topics", "--limit", "100"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def node_view(router: str, id: str) -> Dict[str, Any]:
    return next(n for n in topics_view(router)["nodes"] if n["id"] == id)


def bus_status(router: str) -> Dict[str, Any]:
    out = subprocess.run([os.path.join(BUILD_DIR, "src", "rlbus-ctl"),
                          "--timeout", CTL_TIMEOUT_MS, "--broker", router,
                          "--json", "status"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["bus"]


def innocent_pair(router: str, n: int, size: int, within: float, prefix: str = "good",
                  curve: Optional[rlbus.CurveKeys] = None) -> Dict[str, float]:
    """A publisher and a subscriber on `{prefix}.t` that keep up: every one of `n`
    publications must arrive, in order, with no gap, within `within` seconds of the first.
    Returns what was seen (the rate and the longest wait between two arrivals)."""
    p = _node(router, f"{prefix}-pub", curve=curve)
    s = _node(router, f"{prefix}-sub", curve=curve)
    try:
        s.subscribe(f"{prefix}.t")
        body = b"g" * (size - 4)
        errors: List[BaseException] = []

        def emit() -> None:
            try:
                for i in range(n):
                    p.publish(f"{prefix}.t", i.to_bytes(4, "big") + body, timeout=within)
            except BaseException as e:  # reported by the assertion below
                errors.append(e)
        t = threading.Thread(target=emit, daemon=True)
        start = time.monotonic()
        t.start()
        got: List[int] = []
        longest, last = 0.0, start
        deadline = start + within
        while len(got) < n:
            left = deadline - time.monotonic()
            assert left > 0 and not errors, \
                f"the innocent pair got {len(got)} of {n} in {within} s: {errors}"
            m = s.recv(timeout=min(left, 1.0))
            if m is None:
                continue
            now = time.monotonic()
            longest, last = max(longest, now - last), now
            got.append(int.from_bytes(m.payload[:4], "big"))
        t.join(within)
        assert got == list(range(n))
        assert s.lost == 0  # a node that keeps up never sees a gap
        took = time.monotonic() - start
        return {"rate": n / took, "longest_wait": longest, "took": took}
    finally:
        p.close(2)
        s.close(2)


def test_a_vanished_subscriber_holds_publishers_back_only_until_its_stall_timeout(
        broker_factory) -> None:
    """A node that subscribes to everything and vanishes without DISCONNECT (its session
    lives 3 x 60 s): its queue fills and holds the publisher back, and after bus-stall-timeout
    without an acknowledgement its unsent deliveries are dropped and it holds no one back."""
    br = broker_factory("--bus-queue-bytes", str(256 * 1024), "--bus-stall-timeout", "1000",
                        "--status-interval", "100", "--log-level", "info")
    ctx = zmq.Context()
    try:
        alone = innocent_pair(br.router, 2000, 4096, within=60, prefix="alone")
        ghost = Node(ctx, br.router, "ghost")
        ghost.subscribe("", prefix=True)
        ghost.sock.close(0)  # gone, without a word: the broker keeps its session for 180 s
        # 8 MiB through a node whose queue holds 256 KiB: without the stall bound the
        # publisher waits for the ghost's session to expire, three minutes.
        seen = innocent_pair(br.router, 2000, 4096, within=60)
        print(f"\ninnocent pair beside a vanished subscriber: {seen['rate']:.0f} msgs/s "
              f"({seen['rate'] / alone['rate']:.2f} x its rate alone), longest wait "
              f"{seen['longest_wait'] * 1000:.0f} ms")
        view = node_view(br.router, "ghost")
        assert view["stalled"] and view["stalls"] >= 1 and view["dropped"] > 0, view
        assert view["queued_bytes"] <= 256 * 1024, view  # held no more than its bound
        assert bus_status(br.router)["stalls"] >= 1
        assert any("bus node ghost held" in line and "acknowledged nothing" in line
                   for line in br.lines), "".join(br.lines[-20:])
    finally:
        ctx.term()


def test_a_held_back_publisher_learns_who_holds_it(broker_factory) -> None:
    """The publisher's TimeoutError names the node that holds it back (PUBLISH_CREDIT's
    held_by), and OPS `topics` names the laggard beside the publisher, and the other way."""
    br = broker_factory("--bus-queue-bytes", str(64 * 1024), "--bus-stall-timeout", "0")
    ctx = zmq.Context()
    p = _node(br.router, "talker")
    slow = Node(ctx, br.router, "sleeper")
    try:
        slow.subscribe("t")
        with pytest.raises(TimeoutError) as held:
            for _ in range(2000):  # past what the SDK queues while held back (256)
                p.publish("t", b"z" * 8192, timeout=1.0)
        assert "node sleeper does not keep up" in str(held.value), held.value

        def named() -> bool:
            v = topics_view(br.router)
            nodes = {n["id"]: n for n in v["nodes"]}
            return nodes["talker"]["held_by"] == "sleeper" \
                and nodes["sleeper"]["holding_back"] == ["talker"]
        assert wait_until(named, 10, 0.1), topics_view(br.router)
        out = subprocess.run([os.path.join(BUILD_DIR, "src", "rlbus-ctl"),
                              "--timeout", CTL_TIMEOUT_MS, "--broker",
                              br.router, "topics"], capture_output=True, text=True, timeout=60)
        assert "held back by sleeper" in out.stdout and "holds back talker" in out.stdout, \
            out.stdout
    finally:
        slow.close()
        p.close(0.5)
        ctx.term()


def _attack(router: str, ctx: zmq.Context, stop: threading.Event,
            curve: Optional[rlbus.CurveKeys]) -> List[Any]:
    """Three subscribers that never acknowledge, each on a topic of its own, and a publisher
    per topic that keeps sending 256 KiB within its credit: together their queues pass half of
    bus-memory."""
    made: List[Any] = []
    threads = []
    for k in range(3):
        sub = Node(ctx, router, f"evil-sub-{k}", curve=curve)
        sub.subscribe(f"evil.{k}")
        made.append(sub)
        p = _node(router, f"evil-pub-{k}", curve=curve)
        made.append(p)

        def flood(p: rlbus.Bus = p, topic: str = f"evil.{k}") -> None:
            while not stop.is_set():
                try:
                    p.publish(topic, b"e" * (256 * 1024), timeout=0.5)
                except TimeoutError:
                    pass
                except RuntimeError:
                    return
        threads.append(threading.Thread(target=flood, daemon=True))
    for t in threads:
        t.start()
    return made


@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_confined_nodes_that_never_acknowledge_do_not_freeze_the_rest_of_the_bus(
        broker_factory, tmp_path, mode: str) -> None:
    """Three subscribers that read nothing fill their queues (each bounded) until the bus
    holds more than half of bus-memory; a pair on another topic still gets every publication
    through, at once, and the attackers' publishers are the ones held back."""
    args = ["--bus-queue-bytes", str(4 * MiB), "--bus-memory", str(8 * MiB),
            "--bus-stall-timeout", "0"]
    evil = good = None
    ctl: List[str] = []
    if mode == "curve":
        keys = {s: keygen(tmp_path, s) for s in ("broker", "evil", "good", "ops")}
        allow = allowlist(tmp_path, [
            entry(keys["evil"], '"bus"') + 'topics = ["evil."]\n',
            entry(keys["good"], '"bus"') + 'topics = ["good."]\n',
            entry(keys["ops"], '"operator"')])
        args += ["--curve-key", keys["broker"] + ".key", "--allowlist", allow]
        evil, good = (rlbus.curve_keys_from_files(keys[s] + ".key", keys["broker"] + ".pub")
                      for s in ("evil", "good"))
        ctl = ["--curve-key", keys["ops"] + ".key", "--broker-key", keys["broker"] + ".pub"]
    br = broker_factory(*args)
    ctx = zmq.Context()
    stop = threading.Event()
    alone = innocent_pair(br.router, 500, 1024, within=30, curve=good, prefix="good.alone")
    made = _attack(br.router, ctx, stop, evil)
    try:
        def short() -> bool:
            return topics_view(br.router, ctl) is not None and \
                sum(n["queued_bytes"] for n in topics_view(br.router, ctl)["nodes"]
                    if n["id"].startswith("evil-sub")) > 4 * MiB
        assert wait_until(short, 30, 0.2), topics_view(br.router, ctl)
        seen = innocent_pair(br.router, 500, 1024, within=30, curve=good)
        print(f"\ninnocent pair beside three nodes that never acknowledge ({mode}): "
              f"{seen['rate']:.0f} msgs/s ({seen['rate'] / alone['rate']:.2f} x its rate "
              f"alone), longest wait {seen['longest_wait'] * 1000:.0f} ms")
        nodes = {n["id"]: n for n in topics_view(br.router, ctl)["nodes"]}
        assert any(nodes[f"evil-pub-{k}"]["held_back"] for k in range(3)), nodes
        for k in range(3):  # each attacker's queue within its bound
            assert nodes[f"evil-sub-{k}"]["queued_bytes"] <= 4 * MiB + 256 * 1024
    finally:
        stop.set()
        for m in made:
            m.close(0) if isinstance(m, rlbus.Bus) else m.close()
        ctx.term()


def test_many_subscribers_that_never_acknowledge_are_bounded_in_rss(broker_factory) -> None:
    """32 nodes subscribed to one topic that never acknowledge, and 1-byte publications until
    the publisher is held back: what every queue entry costs counts against bus-memory, so
    the broker's RSS grows by no more than bus-memory and a fixed overhead."""
    bus_memory, budget = 32 * MiB, 64 * MiB
    br = broker_factory("--bus-memory", str(bus_memory), "--bus-stall-timeout", "0",
                        "--memory-budget", str(budget))
    ctx = zmq.Context()
    subs: List[Node] = []
    try:
        for k in range(32):
            n = Node(ctx, br.router, f"mute-{k}")
            n.subscribe("x")
            subs.append(n)
        before = rss_mib(br.proc.pid)
        p = Node(ctx, br.router, "spray")
        limit, seq, cap = p.credit["limit"], 0, 150_000
        idle_since = give_up = time.monotonic()
        give_up += 60
        while seq < cap and time.monotonic() < give_up:
            while seq < limit and seq < cap:
                seq += 1
                p.send("PUBLISH", pub(seq, "x"), b"1")
            if p.sock.poll(50):
                m = p.recv(skip=("HEARTBEAT",))
                if m.name == "PUBLISH_CREDIT" and m["limit"] > limit:
                    limit, idle_since = m["limit"], time.monotonic()
            elif time.monotonic() - idle_since > 2.0:
                break  # held back: no more credit for 2 s
        status = bus_status(br.router)
        after = rss_mib(br.proc.pid)
        print(f"\n{seq} publications to 32 mute nodes; bus holds "
              f"{status['queued_bytes'] / MiB:.1f} MiB; RSS {before:.0f} -> {after:.0f} MiB")
        assert seq < cap and time.monotonic() < give_up, "never held back"
        assert status["queued_bytes"] <= bus_memory
        # bus-memory, memory-budget (what libzmq holds for the mute connections) and 24 MiB
        assert after - before <= (bus_memory + budget) / MiB + 24, (before, after)
        p.close()
    finally:
        for n in subs:
            n.close()
        ctx.term()


@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_a_fragment_never_reaches_a_later_session_of_its_recipients_id(
        broker_factory, tmp_path, mode: str) -> None:
    """A subscriber receives part 0 of a publication and leaves; a new session under its id,
    subscribed to nothing (with CURVE: under a key limited to another prefix), gets none of
    the rest: a publication's recipients are sessions."""
    args: List[str] = []
    owner = other = None
    if mode == "curve":
        keys = {s: keygen(tmp_path, s) for s in ("broker", "owner", "public")}
        allow = allowlist(tmp_path, [entry(keys["owner"], '"bus"'),
                                     entry(keys["public"], '"bus"') + 'topics = ["public."]\n'])
        args = ["--curve-key", keys["broker"] + ".key", "--allowlist", allow]
        owner, other = (rlbus.curve_keys_from_files(keys[s] + ".key", keys["broker"] + ".pub")
                        for s in ("owner", "public"))
    br = broker_factory(*args)
    ctx = zmq.Context()
    made: List[Node] = []

    def node(id: str, curve: Optional[rlbus.CurveKeys]) -> Node:
        made.append(Node(ctx, br.router, id, curve=curve))
        return made[-1]
    try:
        p, s, witness = node("p", owner), node("s", owner), node("w", owner)
        s.subscribe("secret.t")
        witness.subscribe("secret.t")  # sees what every recipient gets
        p.send("PUBLISH", pub(1, "secret.t", more=True), b"part0")
        d = s.recv("DELIVER")
        assert (d.get("part", 0), d.payload) == (0, b"part0")
        s.send("DISCONNECT", {"code": 200, "reason": "leaving mid-publication"})
        later = None
        deadline = time.monotonic() + 10
        while later is None:  # once the broker has read the DISCONNECT (another connection)
            try:
                later = node("s", other)  # a new session of its id, subscribed to nothing
            except AssertionError:
                made.pop().close()
                assert time.monotonic() < deadline, "no new session for id s"
                time.sleep(0.05)
        p.send("PUBLISH", pub(2, "secret.t", part=1, more=True), b"part1")
        p.send("PUBLISH", pub(3, "secret.t", part=2), b"part2")
        p.send("PUBLISH", pub(4, "secret.t", more=True), b"open")
        p.send("DISCONNECT", {"code": 200, "reason": "gone mid-publication"})
        got = [witness.recv("DELIVER") for _ in range(5)]
        assert [(g.payload, g.get("abandoned", False)) for g in got] == [
            (b"part0", False), (b"part1", False), (b"part2", False), (b"open", False),
            (b"", True)]
        # The broker has queued all of it by now: the later session got none of it (a
        # DELIVER would come before the answer to its HEARTBEAT).
        later.quiet()
    finally:
        for n in made:
            n.close()
        ctx.term()


def _retain_many(p: Node, count: int, width: int = 6) -> None:
    """`count` retained 1-byte values on topics v.000000, v.000001, ... sent within credit."""
    limit, seq = p.credit["limit"], 0
    while seq < count:
        while seq < limit and seq < count:
            seq += 1
            p.send("PUBLISH", pub(seq, f"v.{seq - 1:0{width}d}", retain=True), b"r")
        m = p.recv("PUBLISH_CREDIT", timeout=10)
        limit = max(limit, m["limit"])
    while p.recv("PUBLISH_CREDIT", timeout=10)["acked"] < count:
        pass


def test_retained_values_and_last_subscribers_are_bounded_in_rss(broker_factory) -> None:
    """100,000 retained 1-byte values against an 8 MiB bus-retain-bytes: each counts what
    keeping it costs, so the broker keeps fewer and its RSS stays within the bound; 8
    subscribers with `last` that never read get a replay bounded by their queues."""
    retain_bytes, bus_memory, budget = 8 * MiB, 32 * MiB, 64 * MiB
    br = broker_factory("--bus-retain-bytes", str(retain_bytes), "--bus-memory",
                        str(bus_memory), "--memory-budget", str(budget),
                        "--bus-stall-timeout", "0")
    ctx = zmq.Context()
    made: List[Node] = []
    try:
        base = rss_mib(br.proc.pid)
        p = Node(ctx, br.router, "keeper")
        made.append(p)
        _retain_many(p, 100_000)
        status = bus_status(br.router)
        kept = rss_mib(br.proc.pid)
        print(f"\n100000 retained values: {status['retained']} kept, counted "
              f"{status['retained_bytes'] / MiB:.1f} MiB; RSS {base:.0f} -> {kept:.0f} MiB")
        assert status["retained_bytes"] <= retain_bytes
        assert 0 < status["retained"] < 100_000 and status["retain_evicted"] > 0
        assert kept - base <= retain_bytes / MiB + 12, (base, kept)
        for k in range(8):
            n = Node(ctx, br.router, f"late-{k}")
            n.subscribe("v.", prefix=True, last=True)
            made.append(n)
        assert wait_until(lambda: all(node_view(br.router, f"late-{k}")["queued"] > 0
                                      for k in range(8)), 10, 0.1)
        after = rss_mib(br.proc.pid)
        print(f"8 late subscribers that never read: RSS {kept:.0f} -> {after:.0f} MiB")
        assert after - base <= (retain_bytes + bus_memory + budget) / MiB + 12, (base, after)
        for k in range(8):  # each holds a bounded part of the replay, not all of it
            view = node_view(br.router, f"late-{k}")
            assert 0 < view["queued"] and view["queued_bytes"] <= 64 * MiB // 4 + 4096, view
    finally:
        for n in made:
            n.close()
        ctx.term()


def test_a_long_replay_goes_on_as_the_node_reads_and_keeps_each_topics_order(
        broker_factory) -> None:
    """A `last` prefix subscription with far more retained values than a quarter of its queue
    holds: every value arrives, in topic order, with no gap; and a live publication on a topic
    not replayed yet comes after that topic's retained value."""
    br = broker_factory("--bus-queue-bytes", str(64 * 1024), "--bus-window", "64")
    ctx = zmq.Context()
    p = Node(ctx, br.router, "keeper")
    s = Node(ctx, br.router, "reader")
    try:
        _retain_many(p, 3000, width=4)
        s.subscribe("v.", prefix=True, last=True)
        p.send("PUBLISH", pub(3001, "v.2999"), b"live")  # not retained: delivered, and kept
        got: List[Any] = []
        while len(got) < 3001:
            d = s.recv(None, timeout=10)
            assert d.name == "DELIVER", (d.name, d.fields)
            got.append((d["topic"], d.payload, d.get("retained", False)))
            s.send("BUS_ACK", {"seq": d["seq"]})
        replayed = [t for t, _, r in got if r]
        assert sorted(replayed) == [f"v.{i:04d}" for i in range(3000)]  # each once
        assert [t for t in replayed if t != "v.2999"] == [f"v.{i:04d}" for i in range(2999)]
        live = got.index(("v.2999", b"live", False))
        assert got[live - 1] == ("v.2999", b"r", True)  # its topic's retained value first
    finally:
        p.close()
        s.close()
        ctx.term()


def test_what_the_bus_does_not_keep_or_name_is_still_counted(broker_factory) -> None:
    """A retained value that alone costs more than bus-retain-bytes is counted as forgotten;
    topics past the 1024 the broker names are counted together under a name no topic can
    have, and `topics_total` counts only the named ones."""
    br = broker_factory("--bus-retain-bytes", "4096")
    ctx = zmq.Context()
    p = Node(ctx, br.router, "p")
    try:
        limit, seq = p.credit["limit"], 0

        def send(topic: str, payload: bytes, **opts: Any) -> None:
            nonlocal limit, seq
            seq += 1
            while seq > limit:
                limit = max(limit, p.recv("PUBLISH_CREDIT")["limit"])
            p.send("PUBLISH", pub(seq, topic, **opts), payload)
        send("big", b"b" * 8192, retain=True)
        for k in range(1030):
            send(f"t.{k:04d}", b"x")
        while p.recv("PUBLISH_CREDIT")["acked"] < seq:
            pass
        status = bus_status(br.router)
        assert status["retained"] == 0 and status["retain_evicted"] == 1, status
        out = subprocess.run([os.path.join(BUILD_DIR, "src", "rlbus-ctl"),
                              "--timeout", CTL_TIMEOUT_MS, "--broker",
                              br.router, "--json", "topics", "--limit", "1000"],
                             capture_output=True, text=True, timeout=60)
        view = json.loads(out.stdout)
        assert view["topics_total"] == 1024
        other = [t for t in view["topics"] if " " in t["topic"]]
        assert [t["topic"] for t in other] == ["(other topics)"] and other[0]["messages"] == 7
    finally:
        p.close()
        ctx.term()


def test_a_thousand_nodes_that_subscribe_to_everything_and_vanish(broker_factory) -> None:
    """1,000 nodes connect, subscribe to every topic and vanish without a word (their sessions
    live three minutes): the publishers they hold back go on after bus-stall-timeout, and the
    broker's RSS grows by no more than bus-memory and a fixed overhead."""
    bus_memory = 32 * MiB
    br = broker_factory("--bus-memory", str(bus_memory), "--bus-queue-bytes", str(1 << 20),
                        "--bus-stall-timeout", "1000", "--status-interval", "100")
    ctx = zmq.Context()
    try:
        base = rss_mib(br.proc.pid)
        for k in range(1000):
            ghost = Node(ctx, br.router, f"gone-{k}")
            ghost.subscribe("", prefix=True)
            ghost.close()
        seen = innocent_pair(br.router, 2000, 4096, within=120)
        after = rss_mib(br.proc.pid)
        status = bus_status(br.router)
        print(f"\nbeside 1000 vanished nodes: {seen['rate']:.0f} msgs/s, longest wait "
              f"{seen['longest_wait'] * 1000:.0f} ms; {status['stalled']} stalled; bus holds "
              f"{status['queued_bytes'] / MiB:.1f} MiB; RSS {base:.0f} -> {after:.0f} MiB")
        assert status["stalled"] >= 1
        assert status["queued_bytes"] <= bus_memory
        assert after - base <= bus_memory / MiB + 48, (base, after)
    finally:
        ctx.term()
