"""What DI-engine's distributed mode needs of an MQ beyond its own tests: three nodes in a mesh
and in a star, unsubscribing by glob, a prompt stop, a slow subscriber beside a fast publisher
losing nothing, and large payloads."""

import hashlib
import os
import pickle
import threading
import time

import pytest

from ding.framework import Parallel, task

from .helpers import Side, node_id, run, wait_until

N = 3


def three_main(side_dir, topology):
    side = Side(side_dir)
    router = Parallel()
    me = node_id()
    if hasattr(router._mq, "attach_to"):  # optional: if exposed, with nng's lengths
        assert router.get_attch_to_len() == {"mesh": me, "star": min(me, 1)}[topology]
    heard = set()
    router.on("hello", lambda sender: heard.add(sender))
    # the hub must hear both leaves and each leaf the hub; in a mesh everyone hears everyone
    must = {0: {1, 2}}.get(me, {0}) if topology == "star" else set(range(N)) - {me}

    def say():
        router.emit("hello", me)
        if must <= heard and not side.has(f"heard_{me}"):
            side.mark(f"heard_{me}", sorted(heard))

    side.wait(*(f"heard_{i}" for i in range(N)), timeout=20, every=0.03, action=say)
    assert me not in heard


@pytest.mark.parametrize("topology", ["mesh", "star"])
def test_three_nodes(mq, tmp_path, topology):
    run(mq, N, three_main, str(tmp_path), topology, topology=topology, startup_interval=0.1)


def glob_main(side_dir):
    side = Side(side_dir)
    router = Parallel()
    me = node_id()
    if me == 1:
        n = [0]

        def send():
            for topic in ("task.a", "task.b", "other"):
                router.emit(topic, n[0])
            n[0] += 1

        side.wait("done_0", timeout=30, every=0.01, action=send)
        return
    delivered = {"task.a": 0, "task.b": 0, "other": 0}
    handle = router._handle_message

    def counting(topic, payload):  # what the MQ delivers, in the listener thread
        delivered[topic] = delivered.get(topic, 0) + 1
        handle(topic, payload)

    router._handle_message = counting
    calls = []
    router.on("task.a", lambda i: calls.append("task.a"))
    router.on("task.b", lambda i: calls.append("task.b"))
    router.on("other", lambda i: calls.append("other"))
    assert wait_until(lambda: {"task.a", "task.b", "other"} <= set(calls), 20)
    router.off("task.*")
    calls.clear()
    # let what was in flight drain: 20 more "other" messages
    base = delivered["other"]
    assert wait_until(lambda: delivered["other"] >= base + 20, 20)
    before = delivered["task.a"] + delivered["task.b"]
    base = delivered["other"]
    assert wait_until(lambda: delivered["other"] >= base + 20, 20)
    after = delivered["task.a"] + delivered["task.b"]
    side.mark("done_0")
    assert "task.a" not in calls and "task.b" not in calls, "a listener ran after off()"
    assert after == before, f"the MQ still delivers task.* after unsubscribe('task.*'): " \
                            f"{after - before} in a window of 20 'other' messages"


@pytest.mark.mq_xfail("redis", reason="Redis takes the glob as a channel name")
def test_unsubscribe_glob(mq, tmp_path):
    run(mq, 2, glob_main, str(tmp_path), startup_interval=0.1)


def stop_main(side_dir):
    side = Side(side_dir)
    router = Parallel()
    me = node_id()
    if me == 1:
        # keeps publishing while node 0 stops, and after
        side.wait("stopped_0", timeout=30, every=0.01, action=lambda: router.emit("traffic", me))
        return
    got = []
    router.on("traffic", lambda sender: got.append(sender))
    with task.start():
        assert wait_until(lambda: got, 20), "no traffic from node 1"
    listener = router._listener
    assert listener.is_alive()
    t0 = time.monotonic()
    router.stop()
    took = time.monotonic() - t0
    side.mark("stopped_0", took)
    assert not listener.is_alive(), "the listener outlived stop()"
    assert took < 1.5, f"stop() took {took:.2f} s"
    left = [t.name for t in threading.enumerate()
            if not t.daemon and t is not threading.main_thread()]
    assert not left, f"non-daemon threads left after stop(): {left}"
    router.stop()  # idempotent: the runner stops it again


def test_stop_is_prompt(mq, tmp_path):
    run(mq, 2, stop_main, str(tmp_path), startup_interval=0.1)
    assert Side(tmp_path).read("stopped_0") < 1.5


SLOW_COUNT = 4000
SLOW_SIZE = 2048


def slow_main(side_dir, count, size):
    """Node 0 publishes ``count`` messages as fast as it can on one topic; node 1's listener
    takes ~0.5 ms per message (far slower). Node 1 records the sequence numbers in the
    order the MQ delivered them."""
    side = Side(side_dir)
    router = Parallel()
    me = node_id()
    if me == 0:
        side.wait("ready_1", timeout=20, every=0.02, action=lambda: router.emit("probe", 0))
        blob = b"x" * size
        t0 = time.monotonic()
        for i in range(count):
            router.emit("flood", i, blob)
        side.mark("sent_0", time.monotonic() - t0)
        side.wait("done_1", timeout=60)
        return
    seqs = []
    handle = router._handle_message
    slept = [0]

    def slow(topic, payload):
        if topic == "flood":
            seqs.append(pickle.loads(payload)["a"][0])
            slept[0] += 1
            if slept[0] % 20 == 0:
                time.sleep(0.01)
        handle(topic, payload)

    router._handle_message = slow
    router.on("flood", lambda i, blob: None)
    router.on("probe", lambda i: side.mark("ready_1"))  # subscribed after flood: ordered MQs
    side.wait("ready_1", timeout=20)

    def progress():  # all there, or nothing new for 2 s
        n = len(seqs)
        return n >= count or not wait_until(lambda: len(seqs) > n, 2)

    side.wait("sent_0", timeout=60)
    while not progress():
        pass
    side.mark("seqs_1", seqs)
    side.mark("done_1")


@pytest.mark.mq_xfail("zmqpubsub", reason="PUB/SUB drops at a queue's high-water mark instead "
                      "of holding a fast publisher back")
def test_slow_subscriber_loses_nothing(mq, tmp_path):
    run(mq, 2, slow_main, str(tmp_path), SLOW_COUNT, SLOW_SIZE, startup_interval=0.1)
    seqs = Side(tmp_path).read("seqs_1")
    lost = SLOW_COUNT - len(set(seqs))
    assert lost == 0, f"{lost} of {SLOW_COUNT} lost"
    assert seqs == sorted(seqs), "one publisher's messages on one topic came out of order"


def large_main(side_dir, size):
    side = Side(side_dir)
    router = Parallel()
    me = node_id()
    if me == 0:
        payload = os.urandom(1024) * (size // 1024) + os.urandom(size % 1024)
        side.wait("ready_1", timeout=20, every=0.05, action=lambda: router.emit("big_probe"))
        t0 = time.monotonic()
        router.emit("big", payload, hashlib.sha256(payload).hexdigest())
        side.wait("got_1", timeout=60)
        side.mark("took", time.monotonic() - t0)
        return
    got = []
    router.on("big", lambda payload, digest: got.append(
        (len(payload), hashlib.sha256(payload).hexdigest() == digest)))
    router.on("big_probe", lambda: side.mark("ready_1"))
    assert wait_until(lambda: got, 60), "the large payload never arrived"
    side.mark("got_1", got[0])


LARGE = [4 << 20] + ([100 << 20] if os.environ.get("DITASK_LARGE") == "1" else [])


@pytest.mark.parametrize("size", LARGE, ids=lambda s: f"{s >> 20}MiB")
def test_large_payload(mq, tmp_path, size):
    run(mq, 2, large_main, str(tmp_path), size, startup_interval=0.1)
    assert Side(tmp_path).read("got_1") == [size, True]
