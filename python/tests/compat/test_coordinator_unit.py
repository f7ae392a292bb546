"""CommCoordinator against a stand-in SDK: config, task submission and the callback_fn
conventions of DI-engine's Coordinator."""

import logging

import pytest

from rlbus.compat import CommCoordinator, resolve_endpoint

KEYS = ("deal_with_collector_send_data", "deal_with_collector_judge_finish",
        "deal_with_collector_finish_task", "deal_with_learner_get_data",
        "deal_with_learner_judge_finish", "deal_with_learner_send_info",
        "deal_with_learner_finish_task", "deal_with_increase_collector",
        "deal_with_decrease_collector")


class Recorder:
    """callback_fn whose entries record their arguments and return preset values."""

    def __init__(self, **returns):
        self.calls = []
        self.returns = returns
        self.fn = {k: self._make(k) for k in KEYS}

    def _make(self, key):
        def call(*args):
            self.calls.append((key,) + args)
            value = self.returns.get(key)
            if isinstance(value, Exception):
                raise value
            return value
        return call

    def named(self, key):
        return [c[1:] for c in self.calls if c[0] == key]


def make(cfg=None, **returns):
    rec = Recorder(**returns)
    base = {"collector_task_timeout": 30, "learner_task_timeout": 600, "operator_server": {},
            "broker": "tcp://127.0.0.1:5999"}
    base.update(cfg or {})
    return CommCoordinator(base, rec.fn, logging.getLogger("test")), rec


def test_endpoint_from_config_env_and_default(monkeypatch):
    monkeypatch.delenv("RLBUS_ENDPOINT", raising=False)
    assert resolve_endpoint({}) == "tcp://127.0.0.1:7235"
    monkeypatch.setenv("RLBUS_ENDPOINT", "tcp://10.0.0.1:9000")
    assert resolve_endpoint({}) == "tcp://10.0.0.1:9000"
    assert resolve_endpoint({"rlbus": {"endpoint": "tcp://a:1"}}) == "tcp://a:1"
    assert resolve_endpoint({"broker": "tcp://b:2", "rlbus": {"endpoint": "tcp://a:1"}}) == "tcp://b:2"


def test_constructor_does_no_io_and_close_before_start_is_noop(fake_sdk):
    cc, _ = make()
    cc.close()
    assert fake_sdk.Coordinator.instances == []
    assert cc.send_collector_task({"task_id": "c1", "buffer_id": "b"}) is False


def test_start_connects_with_configured_id_and_no_capacity_callbacks_in_static_mode(fake_sdk):
    cc, _ = make({"rlbus": {"id": "coord-1"}})
    cc.start()
    client = fake_sdk.Coordinator.instances[0]
    assert client.endpoint == "tcp://127.0.0.1:5999" and client.id == "coord-1"
    assert "deal_with_increase_collector" not in client.callbacks
    assert "deal_with_decrease_collector" not in client.callbacks
    cc.close()
    assert client.closed


def test_each_run_gets_a_coordinator_id_of_its_own_unless_one_is_set(fake_sdk, monkeypatch):
    # A run that died leaves its tasks to the broker's grace period: a new run on the same
    # broker under the same id would adopt them (and hear of the dead run's workers).
    monkeypatch.delenv("RLBUS_COORDINATOR_ID", raising=False)
    ids = []
    for _ in range(2):
        cc, _ = make()
        cc.start()
        ids.append(fake_sdk.Coordinator.instances[-1].id)
        cc.close()
    assert ids[0] != ids[1] and all(i.startswith("coordinator-") for i in ids)
    # a stable id, for a coordinator that restarts and adopts its own tasks, is asked for
    monkeypatch.setenv("RLBUS_COORDINATOR_ID", "league-1")
    cc, _ = make()
    cc.start()
    assert fake_sdk.Coordinator.instances[-1].id == "league-1"
    cc.close()
    cc, _ = make({"rlbus": {"id": "coord-9"}})  # the config's id comes first
    cc.start()
    assert fake_sdk.Coordinator.instances[-1].id == "coord-9"
    cc.close()


def test_start_raises_when_broker_never_welcomes(fake_sdk, monkeypatch):
    monkeypatch.setattr(fake_sdk.Coordinator, "wait_for", lambda self, state, timeout: False)
    cc, _ = make({"rlbus": {"ready_timeout": 0.3}})
    with pytest.raises(ConnectionError):
        cc.start()
    assert fake_sdk.Coordinator.instances[0].closed


def test_send_task_submits_a_copy_with_timeouts(fake_sdk):
    cc, _ = make({"rlbus": {"start_timeout": 5, "step_timeout": 7}})
    cc.start()
    task = {"task_id": "learner_task_1", "buffer_id": "buf", "policy_id": "p",
            "replay_buffer_cfg": {"size": 3}, "learner_cfg": {"shape": (4, 2)}}
    assert cc.send_learner_task(task) is True
    task.pop("replay_buffer_cfg")  # DI-engine changes the dict right after
    task_id, kind, info, kw = fake_sdk.Coordinator.instances[0].submits[0]
    assert (task_id, kind) == ("learner_task_1", "learner")
    assert info["replay_buffer_cfg"] == {"size": 3}
    assert info["learner_cfg"] == {"shape": [4, 2]}
    assert kw["start_timeout_ms"] == 5000 and kw["step_timeout_ms"] == 7000
    assert kw["max_attempts"] == 1
    assert kw["queue_timeout_ms"] == 600000
    assert cc.send_collector_task({"task_id": "c1", "buffer_id": "buf"}) is True
    assert fake_sdk.Coordinator.instances[0].submits[1][3]["queue_timeout_ms"] == 30000
    cc.close()
    assert sorted(t for t, _ in fake_sdk.Coordinator.instances[0].cancels) == ["c1", "learner_task_1"]


def test_refused_submit_returns_false(fake_sdk):
    cc, _ = make()
    cc.start()
    fake_sdk.Coordinator.instances[0].accept = False
    assert cc.send_collector_task({"task_id": "c1", "buffer_id": "b"}) is False
    # the id is free again for a later try
    fake_sdk.Coordinator.instances[0].accept = True
    assert cc.send_collector_task({"task_id": "c1", "buffer_id": "b"}) is True
    cc.close()


def test_invalid_task_id_is_mapped_back_in_callbacks(fake_sdk):
    cc, rec = make()
    cc.start()
    assert cc.send_collector_task({"task_id": "my task #1", "buffer_id": "b"})
    wire = fake_sdk.Coordinator.instances[0].submits[0][0]
    assert wire != "my task #1" and " " not in wire
    cbs = fake_sdk.Coordinator.instances[0].callbacks
    cbs["deal_with_collector_send_data"](wire, "b", "d1", {"data_id": "d1", "buffer_id": "b",
                                                             "meta": {"data_id": "d1"}})
    assert rec.named("deal_with_collector_send_data")[0][0] == "my task #1"
    cc.close()


def test_collector_callbacks_get_the_metadata_dict_and_default_judge(fake_sdk):
    cc, rec = make(deal_with_collector_judge_finish=None)
    cc._callback_fn.pop("deal_with_collector_judge_finish")
    cc.start()
    cc.send_collector_task({"task_id": "c1", "buffer_id": "buf"})
    cbs = fake_sdk.Coordinator.instances[0].callbacks
    meta = {"data_id": "d7", "buffer_id": "buf", "task_id": "c1", "unroll_split_begin": 0,
            "compressor": "lz4", "priority": 0.5, "policy_iter": 3}
    cbs["deal_with_collector_send_data"]("c1", "buf", "d7",
                                         {"data_id": "d7", "buffer_id": "buf", "meta": meta})
    assert rec.named("deal_with_collector_send_data") == [("c1", "buf", "d7", meta)]
    assert cbs["deal_with_collector_judge_finish"]("c1", {"collector_done": False}) is False
    assert cbs["deal_with_collector_judge_finish"]("c1", {"collector_done": True}) is True
    cbs["deal_with_collector_finish_task"]("c1", {"reward_mean": 1.0})
    assert rec.named("deal_with_collector_finish_task") == [
        ("c1", {"reward_mean": 1.0, "task_id": "c1"})]
    cc.close()


def test_learner_callbacks(fake_sdk):
    batch = [{"data_id": "d1", "priority": 1.0}, {"data_id": "d2", "priority": 2.0}]
    cc, rec = make(deal_with_learner_get_data=batch, deal_with_learner_judge_finish=True)
    cc.start()
    cc.send_learner_task({"task_id": "l1", "buffer_id": "buf"})
    cbs = fake_sdk.Coordinator.instances[0].callbacks
    assert cbs["deal_with_learner_get_data"]("l1", "buf", 2, 5) == batch
    assert rec.named("deal_with_learner_get_data") == [("l1", "buf", 2, 5)]
    assert cbs["deal_with_learner_judge_finish"]("l1", {"learner_done": False}) is True
    cbs["deal_with_learner_send_info"]("l1", "buf", {"learner_step": 1})
    assert rec.named("deal_with_learner_send_info") == [("l1", "buf", {"learner_step": 1})]
    # a close result without buffer_id still names the task's buffer
    cbs["deal_with_learner_finish_task"]("l1", {"task_id": "l1"})
    assert rec.named("deal_with_learner_finish_task") == [("l1", {"task_id": "l1",
                                                                   "buffer_id": "buf"})]
    cc.close()


def test_learner_default_judge_uses_learner_done(fake_sdk):
    cc, rec = make()
    cc._callback_fn.pop("deal_with_learner_judge_finish")
    cc.start()
    cbs = fake_sdk.Coordinator.instances[0].callbacks
    assert cbs["deal_with_learner_judge_finish"]("l1", {"learner_done": True}) is True
    assert cbs["deal_with_learner_judge_finish"]("l1", {"learner_done": False}) is False
    cc.close()


def test_raising_get_data_is_answered_no_data(fake_sdk, caplog):
    cc, rec = make(deal_with_learner_get_data=RuntimeError("unknown learner task"))
    cc.start()
    cbs = fake_sdk.Coordinator.instances[0].callbacks
    with caplog.at_level(logging.WARNING):
        assert cbs["deal_with_learner_get_data"]("l9", "buf", 2, 0) is None
    assert "unknown learner task" in caplog.text
    cc.close()


def test_no_callback_fn_entry_runs_after_close(fake_sdk):
    cc, rec = make(deal_with_learner_get_data=[{"data_id": "x"}],
                   deal_with_collector_judge_finish=True)
    cc.start()
    cbs = fake_sdk.Coordinator.instances[0].callbacks
    cc.close()
    cbs["deal_with_collector_send_data"]("c1", "b", "d", {"meta": {"data_id": "d"}})
    assert cbs["deal_with_collector_judge_finish"]("c1", {"collector_done": True}) is False
    cbs["deal_with_collector_finish_task"]("c1", {})
    assert cbs["deal_with_learner_get_data"]("l1", "b", 2, 0) is None
    cbs["deal_with_learner_send_info"]("l1", "b", {})
    cbs["deal_with_learner_finish_task"]("l1", {})
    assert rec.calls == []


def test_failed_task_is_logged_and_offered_to_an_optional_key(fake_sdk, caplog):
    cc, rec = make()
    failed = []
    cc._callback_fn["deal_with_collector_fail_task"] = lambda *a: failed.append(a)
    cc.start()
    cc.send_collector_task({"task_id": "c1", "buffer_id": "b"})
    cbs = fake_sdk.Coordinator.instances[0].callbacks
    with caplog.at_level(logging.ERROR):
        cbs["on_task_failed"]("c1", "worker reported: close failed", {"message": "x"})
    assert failed == [("c1", "worker reported: close failed", {"message": "x"})]
    assert "close failed" in caplog.text
    assert not any(c[0].endswith("finish_task") for c in rec.calls)
    cc.close()
    assert fake_sdk.Coordinator.instances[0].cancels == []  # nothing left open


def test_operator_address_and_pod_names():
    from rlbus.compat.legacy.operator import _split_addr, pod_name
    assert _split_addr("https://0.0.0.0:14502") == ("0.0.0.0", 14502)
    assert _split_addr("10.0.0.2:80/api") == ("10.0.0.2", 80)
    assert _split_addr("operator.svc") == ("operator.svc", 80)
    assert pod_name("collector-0.ns:22270") == "collector-0"
