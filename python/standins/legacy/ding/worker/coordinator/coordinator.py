"""Coordinator stand-in: uses CommCoordinator the way DI-engine's Coordinator does.

It binds CommCoordinator at import (so only a swap of this module's name reaches it),
builds it in the constructor with the nine callback_fn keys, assigns tasks from a naive
commander on its own threads, records a task only after send_* returned True, pops
replay_buffer_cfg from the learner task right after, rejects unknown task ids (collector
data dropped, learner callbacks raise), and at close joins its threads, closes the comm
layer, then closes and drops every replay buffer.
"""

import logging
import random
import threading
import time
import uuid

from .comm_coordinator import CommCoordinator


class ReplayBuffer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.items = []
        self.pushed = []
        self.updates = []
        self.closed = False
        self._lock = threading.Lock()
        self._next_id = 0

    def push(self, data, cur_collector_envstep=-1):
        with self._lock:
            self.items.append(data)
            self.pushed.append(data)

    def sample(self, batch_size, cur_learner_iter):
        with self._lock:
            if len(self.items) < batch_size:
                return None
            idx = random.sample(range(len(self.items)), batch_size)
            out = []
            for i in idx:
                d = dict(self.items[i])
                self._next_id += 1
                d.update(replay_unique_id="u%d" % self._next_id, replay_buffer_idx=i,
                         priority=1.0)
                out.append(d)
            return out

    def update(self, info):
        with self._lock:
            self.updates.append(info)

    def close(self):
        self.closed = True


class NaiveCommander:
    def __init__(self, collector_task_space=2, learner_task_space=1):
        self._collector_task_space = collector_task_space
        self._learner_task_space = learner_task_space
        self._collector_task_count = 0
        self._learner_task_count = 0
        self._collector_task_finish_count = 0
        self._learner_task_finish_count = 0
        self._learner_info = {}
        self.increases = 0
        self.decreases = 0

    def get_collector_task(self):
        if self._collector_task_count >= self._collector_task_space:
            return None
        self._collector_task_count += 1
        return {
            "task_id": "collector_task_%s_%.2f" % (uuid.uuid4(), time.time() % 1000),
            "buffer_id": "test",
            "collector_cfg": {"env": {"name": "fake"}, "eval_flag": False,
                              "collect_setting": {"eps": 0.9}, "policy_update_path": "p.pth"},
        }

    def get_learner_task(self):
        if self._learner_task_count >= self._learner_task_space:
            return None
        self._learner_task_count += 1
        return {
            "task_id": "learner_task_%s_%.2f" % (uuid.uuid4(), time.time() % 1000),
            "policy_id": "learner_policy",
            "buffer_id": "test",
            "learner_cfg": {"train_iterations": 6},
            "replay_buffer_cfg": {"replay_buffer_size": 100},
            "policy": {"type": "dqn", "model": {"obs_shape": (4,), "action_shape": 2}},
        }

    def finish_collector_task(self, task_id, finished_task):
        self._collector_task_count -= 1
        self._collector_task_finish_count += 1

    def finish_learner_task(self, task_id, finished_task):
        self._learner_task_count -= 1
        self._learner_task_finish_count += 1
        return finished_task["buffer_id"]

    def update_learner_info(self, task_id, info):
        self._learner_info.setdefault(task_id, []).append(info)

    def judge_collector_finish(self, task_id, info):
        return info.get("collector_done", False)

    def judge_learner_finish(self, task_id, info):
        return info.get("learner_done", False)

    def increase_collector_task_space(self):
        self.increases += 1
        self._collector_task_space += 1

    def decrease_collector_task_space(self):
        self.decreases += 1
        self._collector_task_space -= 1


class Coordinator:
    config = dict(collector_task_timeout=30, learner_task_timeout=600, operator_server=dict())

    def __init__(self, cfg):
        self._cfg = cfg
        self._logger = logging.getLogger("ding.coordinator")
        self._commander = NaiveCommander(**cfg.get("commander", {}))
        self._replay_buffer = {}
        self._task_state = {}
        self._historical_task = []
        self._lock = threading.Lock()
        self._end = threading.Event()
        self.system_shutdown_flag = False
        self.calls = []  # (callback name, task_id) in call order, for the tests
        self.late_calls = []  # callbacks that ran after close() returned
        self._closed = False
        callback_fn = {
            "deal_with_collector_send_data": self.deal_with_collector_send_data,
            "deal_with_collector_judge_finish": self.deal_with_collector_judge_finish,
            "deal_with_collector_finish_task": self.deal_with_collector_finish_task,
            "deal_with_learner_get_data": self.deal_with_learner_get_data,
            "deal_with_learner_send_info": self.deal_with_learner_send_info,
            "deal_with_learner_judge_finish": self.deal_with_learner_judge_finish,
            "deal_with_learner_finish_task": self.deal_with_learner_finish_task,
            "deal_with_increase_collector": self.deal_with_increase_collector,
            "deal_with_decrease_collector": self.deal_with_decrease_collector,
        }
        comm_cfg = dict(self.config)
        comm_cfg.update(cfg["coordinator"])
        self._interaction = CommCoordinator(comm_cfg, callback_fn, self._logger)
        self._threads = []

    # -- lifecycle
    def start(self):
        self._interaction.start()
        for target, name in ((self._assign_collector, "assign_collector"),
                             (self._assign_learner, "assign_learner")):
            t = threading.Thread(target=target, name=name)
            t.start()
            self._threads.append(t)

    def close(self):
        self._end.set()
        for t in self._threads:
            t.join()
        self._interaction.close()
        with self._lock:
            for buf in self._replay_buffer.values():
                buf.close()
            self._replay_buffer.clear()
            self._closed = True

    def _assign(self, get_task, send, kind):
        while not self._end.is_set():
            with self._lock:
                task = get_task()
            if task is None:
                self._end.wait(0.05)
                continue
            while not self._end.is_set():
                if send(task):
                    self._record(task, kind)
                    break
                self._end.wait(0.5)

    def _assign_collector(self):
        self._assign(self._commander.get_collector_task, self._interaction.send_collector_task,
                     "collector")

    def _assign_learner(self):
        self._assign(self._commander.get_learner_task, self._interaction.send_learner_task,
                     "learner")

    def _record(self, task, kind):
        with self._lock:
            self._task_state[task["task_id"]] = kind
            if kind == "learner":
                buffer_cfg = task.pop("replay_buffer_cfg")  # the dict changes after send_*
                if task["buffer_id"] not in self._replay_buffer:
                    self._replay_buffer[task["buffer_id"]] = ReplayBuffer(buffer_cfg)

    def _note(self, name, task_id=None):
        self.calls.append((name, task_id))
        if self._closed:
            self.late_calls.append((name, task_id))

    # -- callbacks
    def deal_with_collector_send_data(self, task_id, buffer_id, data_id, data):
        self._note("send_data", task_id)
        with self._lock:
            if task_id not in self._task_state:
                self._logger.error("data of unknown collector task %s dropped", task_id)
                return
            buf = self._replay_buffer.get(buffer_id)
        if buf is None:
            self._logger.error("data for unknown buffer %s dropped", buffer_id)
            return
        buf.push(data, -1)

    def deal_with_collector_judge_finish(self, task_id, info):
        self._note("collector_judge", task_id)
        with self._lock:
            if task_id not in self._task_state:
                return False
            return self._commander.judge_collector_finish(task_id, info)

    def deal_with_collector_finish_task(self, task_id, finished_task):
        self._note("collector_finish", task_id)
        with self._lock:
            self._commander.finish_collector_task(task_id, finished_task)
            self._task_state.pop(task_id, None)
            self._historical_task.append(task_id)

    def deal_with_learner_get_data(self, task_id, buffer_id, batch_size, cur_learner_iter):
        self._note("get_data", task_id)
        with self._lock:
            if task_id not in self._task_state:
                raise RuntimeError("unknown learner task %s" % task_id)
            buf = self._replay_buffer.get(buffer_id)
        if buf is None:
            return None
        return buf.sample(batch_size, cur_learner_iter)

    def deal_with_learner_send_info(self, task_id, buffer_id, info):
        self._note("send_info", task_id)
        with self._lock:
            if task_id not in self._task_state:
                raise RuntimeError("unknown learner task %s" % task_id)
            buf = self._replay_buffer.get(buffer_id)
            if buf is not None:
                buf.update(info["priority_info"])
            self._commander.update_learner_info(task_id, info)

    def deal_with_learner_judge_finish(self, task_id, info):
        self._note("learner_judge", task_id)
        with self._lock:
            if task_id not in self._task_state:
                raise RuntimeError("unknown learner task %s" % task_id)
            return self._commander.judge_learner_finish(task_id, info)

    def deal_with_learner_finish_task(self, task_id, finished_task):
        self._note("learner_finish", task_id)
        with self._lock:
            if task_id not in self._task_state:
                raise RuntimeError("unknown learner task %s" % task_id)
            buffer_id = self._commander.finish_learner_task(task_id, finished_task)
            buf = self._replay_buffer.pop(buffer_id, None)
            if buf is not None:
                buf.close()
            self._task_state.pop(task_id, None)
            self._historical_task.append(task_id)

    def deal_with_increase_collector(self):
        self._note("increase")
        with self._lock:
            self._commander.increase_collector_task_space()

    def deal_with_decrease_collector(self):
        self._note("decrease")
        with self._lock:
            self._commander.decrease_collector_task_space()
