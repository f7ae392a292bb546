"""Parallel over an MQ, shaped as DI-engine's parallel tests: two workers hear each other, a
worker's exception reaches the parent, emitting to a peer that has exited neither raises nor
blocks, and auto_recover re-runs main in the same process over the same MQ."""

import os
import time

import pytest

from ding.framework import Parallel

from .helpers import Side, node_id, run


def ping_main(side_dir):
    side = Side(side_dir)
    router = Parallel()
    me = node_id()
    heard = []
    router.on("test_callback", lambda msg, sender: heard.append((msg, sender)))
    deadline = time.monotonic() + 20
    while not heard and time.monotonic() < deadline:
        router.emit("test_callback", "ping", me)
        time.sleep(0.03)
    assert heard, f"node {me} heard no ping"
    side.mark(f"heard_{me}", heard[0])
    # keep answering until the other one heard too
    side.wait(*(f"heard_{i}" for i in range(2)), timeout=20, every=0.03,
              action=lambda: router.emit("test_callback", "ping", me))
    assert all(sender != me for _, sender in heard), "a node heard itself"


def test_parallel_run(mq, tmp_path):
    run(mq, 2, ping_main, str(tmp_path), startup_interval=0.1)
    side = Side(tmp_path)
    assert side.read("heard_0") == ["ping", 1]
    assert side.read("heard_1") == ["ping", 0]


def raise_main():
    if node_id() == 0:
        raise Exception("P0 Error")


def test_uncaught_exception(mq):
    with pytest.raises(Exception, match="P0 Error"):
        run(mq, 2, raise_main, startup_interval=0.1)


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def disconnected_main(side_dir):
    side = Side(side_dir)
    router = Parallel()
    if node_id() == 0:
        router.on("test_disconnected", lambda *a: None)
        side.mark("pid_0", os.getpid())
        return
    side.wait("pid_0", timeout=20)
    pid = side.read("pid_0")
    deadline = time.monotonic() + 20
    while not _gone(pid):
        assert time.monotonic() < deadline, "node 0 did not exit"
        time.sleep(0.01)
    for i in range(10):
        t0 = time.monotonic()
        router.emit("test_disconnected", "after exit", i)
        assert time.monotonic() - t0 < 0.5, "emit blocked on a gone peer"
    side.mark("emitted_1")


def test_disconnected(mq, tmp_path):
    run(mq, 2, disconnected_main, str(tmp_path), startup_interval=0.1)
    assert Side(tmp_path).has("emitted_1")


def recover_main(side_dir):
    side = Side(side_dir)
    router = Parallel()
    me = node_id()
    if me == 0:
        last = []
        router.on("test_recover", lambda msg: last.append(msg))
        side.mark("ready_0")
        side.wait("done_1", timeout=30)
        side.mark("last_0", last[-1] if last else None)
    elif me == 1:
        got = []
        router.on("test_from_p2", lambda msg: got.append(msg))
        if router._retries == 0:
            raise Exception("P1 Error")
        side.wait("ready_0", "ready_2", timeout=20)
        side.wait("got_1", timeout=20, every=0.05, action=lambda: (
            router.emit("test_recover", "recovered_p1"),
            got and side.mark("got_1", got[-1])))
        side.mark("done_1")
    else:
        side.mark("ready_2")
        side.wait("done_1", timeout=30, every=0.05,
                  action=lambda: router.emit("test_from_p2", "from_p2"))


def test_auto_recover(mq, tmp_path):
    run(mq, 3, recover_main, str(tmp_path), startup_interval=0.1, auto_recover=True,
        max_retries=1)
    side = Side(tmp_path)
    assert side.read("last_0") == "recovered_p1"
    assert side.read("got_1") == "from_p2"


def test_auto_recover_gives_up(mq, tmp_path):
    with pytest.raises(Exception, match="P1 Error"):
        run(mq, 3, recover_main, str(tmp_path), startup_interval=0.1, auto_recover=True,
            max_retries=0)
