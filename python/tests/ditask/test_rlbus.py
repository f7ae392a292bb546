"""What the rlbus MQ adds to DI-engine's distributed mode beyond the shared tests: a runner that
names no broker gets one of its own for the run, and the patch leaves other mq_types alone."""

import os

import pytest

from ding.framework import Parallel

from rlbus.compat import ditask

from .test_parallel import ping_main
from .helpers import Side


def test_a_runner_without_a_broker_starts_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv("RLBUS_ENDPOINT", raising=False)
    monkeypatch.setenv("DITASK_WORKER_TIMEOUT", "60")
    Parallel.runner(n_parallel_workers=2, mq_type="rlbus", startup_interval=0.1)(
        ping_main, str(tmp_path))
    side = Side(tmp_path)
    assert side.read("heard_0") == ["ping", 1] and side.read("heard_1") == ["ping", 0]
    broker = ditask.last_embedded
    assert broker is not None and broker.router.startswith("tcp://127.0.0.1:")
    assert not broker.running  # stopped with the run
    assert "RLBUS_ENDPOINT" not in os.environ and ditask._MARK_ENV not in os.environ


def test_other_mq_types_are_left_alone():
    # the patched runner hands them to the original, which knows no such type
    with pytest.raises(KeyError):
        Parallel.runner(n_parallel_workers=1, mq_type="no-such-mq")(lambda: None)


def test_nng_lengths_of_attach_to():
    assert ditask.nng_attach_to(0, "mesh", None) == []
    assert len(ditask.nng_attach_to(3, "mesh", ["tcp://x:1"])) == 4
    assert ditask.nng_attach_to(0, "star", []) == []
    assert len(ditask.nng_attach_to(2, "star", [])) == 1
    assert ditask.nng_attach_to(5, "alone", ["a"]) == ["a"]
