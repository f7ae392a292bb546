"""A task's life at the wire against the real broker, clause by clause: keep-alives holding
its deadlines and stale ones refused (TASK_ALIVE, SPEC §12.3.19), the start timeout, the retry
hint of "no data yet" (DATA_REPLY retry_ms, §12.3.5, §12.5.9), the queue timeout of a task
nobody takes (§12.3.1 field 11, §12.7.6), the result a failing attempt carries (TASK_FAILED
result, §12.3.18, §12.5.6) and the policy versions pushed to running tasks (POLICY_UPDATE,
§13.4.6-7)."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
import zmq

from conftest import Broker
from rlbus import protocol as P
from wire import Peer, plain


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(0)


def submit(coord: Peer, task_id: str, kind: str = "collector", **extra) -> None:
    coord.send("SUBMIT", dict({"task_id": task_id, "kind": kind, "task_info": {"n": 1}},
                              **extra))
    ans = coord.recv("SUBMITTED")
    assert ans["task_id"] == task_id and ans["accepted"], ans.fields


def start(worker: Peer, coord: Peer, task_id: str) -> P.Message:
    ts = worker.recv("TASK_START")
    assert ts["task_id"] == task_id
    assert coord.event()["event"] == "assigned"
    return ts


def test_task_alive_holds_the_start_deadline_and_emits_nothing(
        broker_factory, ctx: zmq.Context) -> None:
    # Keep-alives 50 ms apart from the moment the task came: only a stall of this process
    # longer than 450 ms would let the start timeout pass between two of them.
    b: Broker = broker_factory("--start-timeout", "500")
    coord = Peer(ctx, b.router, "coordinator", "c-alive")
    worker = Peer(ctx, b.router, "collector", "w-alive")
    submit(coord, "t-alive")
    ts = worker.recv("TASK_START")
    key = {"task_id": "t-alive", "attempt": ts["attempt"]}
    worker.send("TASK_ALIVE", key)  # at once: the start timeout runs from the TASK_START
    assert coord.event()["event"] == "assigned"
    # keep it alive for four start timeouts, then start: the attempt is still ours
    until = time.monotonic() + 2.0
    while time.monotonic() < until:
        worker.send("TASK_ALIVE", key)
        time.sleep(0.05)  # the pace of a busy worker, not a wait for an outcome
    worker.send("STARTED", key)
    worker.send("INFO", dict(key, info={"step": 1}))
    # the very next events are started and info: TASK_ALIVE emitted none, nothing was requeued
    assert [coord.event()["event"] for _ in range(2)] == ["started", "info"]
    # while closing it is refused with 408 (§12.5.5)
    coord.send("FINISH", {"task_id": "t-alive"})
    worker.recv("TASK_CLOSE")
    worker.send("TASK_ALIVE", key)
    err = worker.recv("ERROR")
    assert err["code"] == 408 and err["ref_type"] == P.type_id("TASK_ALIVE")


def test_without_task_alive_the_start_timeout_requeues(broker_factory, ctx) -> None:
    b = broker_factory("--start-timeout", "300")
    coord = Peer(ctx, b.router, "coordinator", "c-noalive")
    worker = Peer(ctx, b.router, "collector", "w-noalive")
    submit(coord, "t-noalive")
    start(worker, coord, "t-noalive")
    ev = coord.event_named("requeued")
    assert ev["body"]["reason"] == "start timeout"


def test_task_alive_from_a_stale_attempt_is_refused(broker_factory, ctx) -> None:
    b = broker_factory("--start-timeout", "300")
    coord = Peer(ctx, b.router, "coordinator", "c-stale")
    worker = Peer(ctx, b.router, "collector", "w-stale")
    submit(coord, "t-stale")
    ts = start(worker, coord, "t-stale")
    coord.event_named("requeued")  # attempt 1 timed out; the task waits for a worker again
    worker.send("TASK_ALIVE", {"task_id": "t-stale", "attempt": ts["attempt"]})
    err = worker.recv("ERROR")
    assert err["code"] == 407 and err["ref_type"] == P.type_id("TASK_ALIVE")


def test_no_data_carries_the_coordinators_retry_hint_or_the_brokers(broker_factory,
                                                                    ctx) -> None:
    b = broker_factory("--no-data-retry", "37")
    coord = Peer(ctx, b.router, "coordinator", "c-retry")
    learner = Peer(ctx, b.router, "learner", "l-retry")
    submit(coord, "t-retry", kind="learner")
    ts = start(learner, coord, "t-retry")
    key = {"task_id": "t-retry", "attempt": ts["attempt"]}
    learner.send("STARTED", key)
    assert coord.event()["event"] == "started"
    ask = dict(key, buffer_id="b", batch_size=4, cur_learner_iter=0)
    learner.send("GET_DATA", dict(ask, request_id=1))
    assert coord.event()["body"]["request_id"] == 1
    coord.send("DATA_REPLY", {"task_id": "t-retry", "request_id": 1, "data": None,
                              "retry_ms": 250})
    nd = learner.recv("NO_DATA")
    assert (nd["request_id"], nd["retry_ms"]) == (1, 250)
    learner.send("GET_DATA", dict(ask, request_id=2))
    assert coord.event()["body"]["request_id"] == 2
    coord.send("DATA_REPLY", {"task_id": "t-retry", "request_id": 2, "data": None})
    nd = learner.recv("NO_DATA")
    assert (nd["request_id"], nd["retry_ms"]) == (2, 37)
    # with a batch the hint is ignored: LEARN carries the data byte for byte
    learner.send("GET_DATA", dict(ask, request_id=3))
    coord.event()
    coord.send("DATA_REPLY", {"task_id": "t-retry", "request_id": 3,
                              "data": [1, 2.5, "x"], "retry_ms": 9})
    got = learner.recv("LEARN")
    assert got["request_id"] == 3 and plain(got["data"]) == [1, 2.5, "x"]


@pytest.mark.parametrize("how", ["submit", "flag"])
def test_a_task_nobody_takes_fails_after_its_queue_timeout(broker_factory, ctx,
                                                           how: str) -> None:
    b = broker_factory(*(["--queue-timeout-ms", "200"] if how == "flag" else []))
    coord = Peer(ctx, b.router, "coordinator", "c-queue-" + how)
    submit(coord, "t-queue", **({"queue_timeout_ms": 200} if how == "submit" else {}))
    ev = coord.event()
    assert ev["event"] == "failed" and ev["attempt"] == 0 and ev["worker_id"] == ""
    assert ev["body"]["reason"] == "no worker took the task within queue_timeout_ms=200"
    # the id is free again
    submit(coord, "t-queue", queue_timeout_ms=86400000)


def test_the_queue_timeout_counts_again_after_a_requeue(broker_factory, ctx) -> None:
    b = broker_factory()
    coord = Peer(ctx, b.router, "coordinator", "c-requeue")
    worker = Peer(ctx, b.router, "collector", "w-requeue")
    submit(coord, "t-rq", queue_timeout_ms=1000, max_attempts=2)
    ts = start(worker, coord, "t-rq")
    worker.send("STARTED", {"task_id": "t-rq", "attempt": ts["attempt"]})
    assert coord.event()["event"] == "started"
    # the attempt runs well past the queue timeout, counted from the SUBMIT ...
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        worker.send("INFO", {"task_id": "t-rq", "attempt": 1, "info": {}})
        assert coord.event()["event"] == "info"
        time.sleep(0.1)
    worker.send("DISCONNECT", {"code": 200, "reason": "leaving"})  # nobody takes attempt 2
    assert coord.event()["event"] == "requeued"
    requeued_at = time.monotonic()
    ev = coord.event()
    # ... yet the task fails only a queue timeout after it was queued again
    assert ev["event"] == "failed" and "queue_timeout_ms=1000" in ev["body"]["reason"]
    assert time.monotonic() - requeued_at >= 0.5


def test_task_failed_result_reaches_the_coordinator_byte_for_byte(broker_factory,
                                                                  ctx) -> None:
    b = broker_factory()
    coord = Peer(ctx, b.router, "coordinator", "c-result")
    worker = Peer(ctx, b.router, "collector", "w-result")
    submit(coord, "t-res", max_attempts=2)
    result = {"done": 7, "why": ["env", 3], 5: b"\x00\x01"}  # an int key is user data too
    raw = P.Raw.of(result)
    for attempt, event in ((1, "requeued"), (2, "failed")):
        ts = start(worker, coord, "t-res")
        assert ts["attempt"] == attempt
        worker.send("TASK_FAILED", {"task_id": "t-res", "attempt": attempt,
                                    "reason": "env crashed", "result": raw})
        ev = coord.recv("TASK_EVENT")
        assert ev["event"] == event
        body = plain(ev["body"])
        assert body["reason"] == "worker reported: env crashed" and body["attempt"] == attempt
        assert body["result"] == result
        assert bytes(ev["body"]).endswith(bytes(raw))  # verbatim, the last entry
    # without one, the body has no result
    submit(coord, "t-res2", max_attempts=1)
    ts = start(worker, coord, "t-res2")
    worker.send("TASK_FAILED", {"task_id": "t-res2", "attempt": 1, "reason": "no"})
    assert "result" not in coord.event_named("failed")["body"]


def test_policy_update_reaches_running_tasks_that_named_the_policy(broker_factory,
                                                                   ctx) -> None:
    b = broker_factory()
    coord = Peer(ctx, b.router, "coordinator", "c-pol")
    learner = Peer(ctx, b.router, "learner", "l-pol")
    named = Peer(ctx, b.router, "collector", "w-named")
    submit(coord, "t-named", policy_id="pi")
    ts = start(named, coord, "t-named")
    assert "policy_id" not in ts.fields  # no version held yet: the task starts anyway
    named.send("STARTED", {"task_id": "t-named", "attempt": 1})
    coord.event()
    other = Peer(ctx, b.router, "collector", "w-other")
    submit(coord, "t-other")
    start(other, coord, "t-other")
    other.send("STARTED", {"task_id": "t-other", "attempt": 1})
    learner.send("POLICY", {"policy_id": "pi", "version": 3, "ref": "ckpt/3"})
    up = named.recv("POLICY_UPDATE")
    assert (up["task_id"], up["attempt"], up["policy_id"], up["policy_version"],
            up["policy_ref"]) == ("t-named", 1, "pi", 3, "ckpt/3")
    assert "policy_params" not in up.fields
    learner.send("POLICY", {"policy_id": "pi", "version": 4, "params": b"\x01\x02"})
    up = named.recv("POLICY_UPDATE")
    assert up["policy_version"] == 4 and up["policy_params"] == b"\x01\x02"
    # the task that named no policy got nothing: its next message is the TASK_CLOSE we cause
    coord.send("FINISH", {"task_id": "t-other"})
    assert other.recv().name == "TASK_CLOSE"
    # a stale version is refused (426) and sends no update
    learner.send("POLICY", {"policy_id": "pi", "version": 4, "ref": "old"})
    assert learner.recv("ERROR")["code"] == 426
    coord.send("FINISH", {"task_id": "t-named"})
    assert named.recv().name == "TASK_CLOSE"
