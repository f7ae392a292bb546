"""The Task layer over an MQ, shaped as DI-engine's task tests: a pipeline that emits to the
other node each step, a remote emit that reaches the peer and never the sender, and one node's
finish stopping the others (in one runner, and across independent runners on one MQ)."""

import multiprocessing
import time

import pytest

from ding.framework import Parallel, task

from .helpers import Side, node_id, run


def pipeline_main(side_dir):
    side = Side(side_dir)
    me = node_id()
    count = []
    with task.start():
        task.on("count", lambda: count.append(1))

        def step(ctx):
            task.emit("count", only_remote=True)
            if count:
                side.mark(f"counted_{me}", len(count))
            time.sleep(0.02)

        task.use(step)
        # run until both nodes counted something; the side channel ends the run
        task.use(lambda ctx: side.has("counted_0", "counted_1") and setattr(task, "finish", True))
        task.run(max_step=1000)
    assert count, f"node {me} counted nothing"


def test_parallel_pipeline(mq, tmp_path):
    run(mq, 2, pipeline_main, str(tmp_path), startup_interval=0.1)
    side = Side(tmp_path)
    assert side.read("counted_0") > 0 and side.read("counted_1") > 0


def emit_remote_main(side_dir):
    """Node 0 listens and marks once greeted; node 1 greets, listening too: it must never
    hear its own greetings."""
    side = Side(side_dir)
    me = node_id()
    greetings = []

    def got(msg):
        greetings.append(msg)
        if me == 0:
            side.mark("greeted")

    with task.start():
        task.on("Greeting", got)
        if me == 1:
            side.wait("greeted", timeout=20, every=0.03,
                      action=lambda: task.emit("Greeting", "hi", only_remote=True))
            # a last one after node 0 is done: it would come back here if the MQ echoed
            task.emit("Greeting", "last", only_remote=True)
            time.sleep(0.2)
        else:
            side.wait("greeted", timeout=20)
    side.mark(f"greetings_{me}", greetings)


def test_emit_remote(mq, tmp_path):
    run(mq, 2, emit_remote_main, str(tmp_path), startup_interval=0.1)
    side = Side(tmp_path)
    assert "hi" in side.read("greetings_0")
    assert side.read("greetings_1") == [], "the sender heard its own emits"


def early_stop_main(side_dir):
    side = Side(side_dir)
    me = node_id()
    with task.start():
        assert {"distributed", f"node.{me}"} <= task.labels
        task.use(lambda ctx: time.sleep(0.1))
        if task.match_labels("node.0"):
            side.mark("started_0")
            task.run(max_step=100)
            side.mark("steps_0", task.ctx.total_step + 1)
            assert task.finish, "node 0 ran out its steps: the finish of node 1 never came"
        else:
            side.wait("started_0", timeout=20)
            task.run(max_step=2)


def test_early_stop(mq, tmp_path):
    run(mq, 2, early_stop_main, str(tmp_path), startup_interval=0.1)
    assert Side(tmp_path).read("steps_0") < 100


def broadcast_finish_main(side_dir):
    side = Side(side_dir)
    me = node_id()
    with task.start():
        side.mark(f"started_{me}")
        task.use(lambda ctx: time.sleep(0.05))
        if me == 1:
            side.wait("started_0", "started_2", timeout=30)
            task.use(lambda ctx: ctx.total_step == 1 and setattr(task, "finish", True))
        task.run(max_step=400)  # 20 s at least unless finished
        side.mark(f"steps_{me}", task.ctx.total_step + 1)


def _runner_process(runner_kwargs, n, side_dir):
    Parallel.runner(n_parallel_workers=n, **runner_kwargs)(broadcast_finish_main, side_dir)


def test_broadcast_finish(mq, tmp_path):
    """Two independent runners meet on one MQ: node 0 alone at tcp://127.0.0.1:50555, nodes 1
    and 2 (alone too) dialling it, as DI-engine's test has them: over nng 1 and 2 hear node 0
    only, and so they do over rlbus. Node 1 finishes at step 1; its finish stops node 0, whose
    own finish then stops node 2: all three stop."""
    ctx = multiprocessing.get_context("spawn")
    first = ctx.Process(target=_runner_process, args=(
        dict(mq.runner_kwargs, topology="alone", node_ids=0, startup_interval=0,
             protocol="tcp", address="127.0.0.1", ports=50555), 1, str(tmp_path)))
    second = ctx.Process(target=_runner_process, args=(
        dict(mq.runner_kwargs, topology="alone", node_ids=[1, 2], startup_interval=0.1,
             protocol="tcp", address="127.0.0.1", ports=50556,
             attach_to=["tcp://127.0.0.1:50555"]), 2, str(tmp_path)))
    first.start()
    second.start()
    first.join(60)
    second.join(60)
    for p in (first, second):
        if p.exitcode is None:
            p.kill()
            p.join()
    assert (first.exitcode, second.exitcode) == (0, 0)
    side = Side(tmp_path)
    steps = [side.read(f"steps_{i}") for i in range(3)]
    assert steps[1] == 2 and steps[0] < 400 and steps[2] < 400, steps


def test_unknown_mq_type_needs_a_parser():
    """A registered mq_type without an args parser entry is refused by the runner."""
    from ding.framework.message_queue import MQ, MQ_REGISTRY

    @MQ_REGISTRY.register("no_parser_mq", force_overwrite=True)
    class NoParser(MQ):
        pass

    with pytest.raises(KeyError):
        Parallel.runner(n_parallel_workers=2, mq_type="no_parser_mq")(print)
