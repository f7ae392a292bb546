"""Fixtures of the ditask tests: the MQ types every test runs over, each set up for one test.

MQ_TYPES is the one list of them (DITASK_MQ_TYPES, comma-separated, overrides it). A type
needs three things: its MQ class registered (imported by this package's __init__), an entry
in the stand-in runner's args parsers, and a setup here that starts what it needs and says
which runner kwargs reach it. A test that needs a guarantee some type lacks carries
``@pytest.mark.mq_xfail(type, reason)``: for that type only it becomes a non-strict xfail.

Environment: DITASK_MQ_TYPES (e.g. "zmqpubsub,redis"; redis needs redis-server and
python3-redis), DITASK_WORKER_TIMEOUT (seconds a runner may take, 60 here),
DITASK_LARGE=1 (adds the 100 MiB payload case).
"""

import contextlib
import os
import shutil
import subprocess

import pytest

import zmq_mq
from rlbus import free_port

from .helpers import wait_until

DEFAULT_MQ_TYPES = "rlbus,zmqpubsub"
MQ_TYPES = [t.strip() for t in os.environ.get("DITASK_MQ_TYPES", DEFAULT_MQ_TYPES).split(",")
            if t.strip()]


class MQRun:
    def __init__(self, name, runner_kwargs):
        self.name = name
        self.runner_kwargs = runner_kwargs  # what Parallel.runner needs besides the worker count


@contextlib.contextmanager
def _zmqpubsub(monkeypatch):
    forwarder = zmq_mq.Forwarder().start()
    monkeypatch.setenv(zmq_mq.FORWARDER_ENV, forwarder.env_value)
    try:
        yield {}
    finally:
        forwarder.stop()


@contextlib.contextmanager
def _redis(monkeypatch):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    redis = pytest.importorskip("redis")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)

    def up():
        try:
            return client.ping()
        except redis.ConnectionError:
            return False

    try:
        assert wait_until(up, 10), "redis-server did not answer"
        yield {"redis_host": "127.0.0.1", "redis_port": port}
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def _rlbus(monkeypatch):
    """One broker for the test's runners (some tests start several, which must meet), named to
    them by $RLBUS_ENDPOINT; test_embedded_broker covers a runner that names none."""
    from rlbus import Broker
    with Broker() as broker:
        monkeypatch.setenv("RLBUS_ENDPOINT", broker.router)
        yield {}


SETUPS = {"rlbus": _rlbus, "zmqpubsub": _zmqpubsub, "redis": _redis}


@pytest.fixture(params=MQ_TYPES)
def mq(request, monkeypatch):
    monkeypatch.setenv("DITASK_WORKER_TIMEOUT", "60")
    with SETUPS[request.param](monkeypatch) as extra:
        yield MQRun(request.param, dict(mq_type=request.param, **extra))


def pytest_configure(config):
    config.addinivalue_line("markers", "mq_xfail(mq_type, reason): a non-strict xfail for "
                            "that MQ type only (a guarantee it does not give)")


def pytest_collection_modifyitems(items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for mark in item.iter_markers("mq_xfail"):
            if params.get("mq") == mark.args[0]:
                item.add_marker(pytest.mark.xfail(strict=False, reason=mark.kwargs["reason"]))
