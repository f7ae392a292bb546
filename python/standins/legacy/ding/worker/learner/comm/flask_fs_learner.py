"""A comm learner shaped like DI-engine's FlaskFileSystemLearner, without torch.

The Slave subclass forwards steps to the comm learner. The learner runs on its own thread:
a prefetching loader asks for data through a 1-slot demand queue (the get-data step blocks
on it) and waits for the batch the learn step delivers; the learn step then blocks for the
next learn info. Each of `train_iterations` iterations sends an info with learner_done
false; the end of the run sends one with learner_done true.
"""

import queue
import threading

from ding.interaction import Slave, TaskFail


class LearnerSlave(Slave):

    def __init__(self, *args, callback_fn, **kwargs):
        super().__init__(*args, **kwargs)
        self._callback_fn = callback_fn

    def _process_task(self, task):
        name = task["name"]
        if name == "resource":
            return self._callback_fn["deal_with_resource"]()
        if name == "learner_start_task":
            self._callback_fn["deal_with_learner_start"](task["task_info"])
            return {"message": "learner task has started"}
        if name == "learner_get_data_task":
            return self._callback_fn["deal_with_get_data"]()
        if name == "learner_learn_task":
            return self._callback_fn["deal_with_learner_learn"](task["data"])
        if name == "learner_close_task":
            return self._callback_fn["deal_with_learner_close"]()
        raise TaskFail(result={"message": "task name error"},
                       message="illegal learner task <{}>".format(name))


class _Learner:

    def __init__(self, owner, iterations, batch_size):
        self.owner = owner
        self.iterations = iterations
        self.batch_size = batch_size
        self.last_iter = 0
        self.end = threading.Event()
        self.prefetch = queue.Queue(1)

    def _loader(self):
        while not self.end.is_set():
            batch = self.owner.get_data(self.batch_size, self.last_iter, self.end)
            if batch is None:
                return
            while not self.end.is_set():
                try:
                    self.prefetch.put(batch, timeout=0.05)
                    break
                except queue.Full:
                    pass

    def run(self):
        loader = threading.Thread(target=self._loader, daemon=True)
        loader.start()
        for it in range(self.iterations):
            batch = None
            while batch is None and not self.end.is_set():
                try:
                    batch = self.prefetch.get(timeout=0.05)
                except queue.Empty:
                    pass
            if batch is None:
                return
            self.last_iter = it + 1
            self.owner.send_learn_info({"learner_step": it, "learner_done": False,
                                        "priority_info": self._priority(batch)})
        self.owner.send_learn_info({"learner_step": self.iterations, "learner_done": True,
                                    "priority_info": {"priority": [], "replay_buffer_idx": [],
                                                      "replay_unique_id": []}})
        self.end.wait()

    @staticmethod
    def _priority(batch):
        return {"priority": [1.0 for _ in batch],
                "replay_buffer_idx": [d["replay_buffer_idx"] for d in batch],
                "replay_unique_id": [d["replay_unique_id"] for d in batch]}

    def close(self):
        self.end.set()


class FlaskFileSystemLearner:

    def __init__(self, cfg):
        self._cfg = cfg
        self._iterations = cfg.get("train_iterations", 10)
        self._demand_queue = queue.Queue(1)
        self._result_queue = queue.Queue(1)
        self._learn_info_queue = queue.Queue(1)
        self._learner = None
        self._thread = None
        self._task_info = None
        self._slave = LearnerSlave(cfg["host"], cfg["port"], callback_fn={
            "deal_with_resource": self.deal_with_resource,
            "deal_with_learner_start": self.deal_with_learner_start,
            "deal_with_get_data": self.deal_with_get_data,
            "deal_with_learner_learn": self.deal_with_learner_learn,
            "deal_with_learner_close": self.deal_with_learner_close,
        })

    def start(self):
        self._slave.start()

    def close(self):
        if self._learner is not None:
            self._learner.close()
        self._slave.close()

    def deal_with_resource(self):
        return {"gpu": 1}

    def deal_with_learner_start(self, task_info):
        self._task_info = task_info
        self._learner = _Learner(self, self._iterations, batch_size=2)
        self._thread = threading.Thread(target=self._learner.run, daemon=True)
        self._thread.start()

    def deal_with_get_data(self):
        return self._demand_queue.get()

    def deal_with_learner_learn(self, data):
        self._result_queue.put(data)
        info = self._learn_info_queue.get()
        return {"info": info, "buffer_id": self._task_info["buffer_id"],
                "task_id": self._task_info["task_id"]}

    def deal_with_learner_close(self):
        self._learner.close()
        self._thread.join()
        self._learner = None
        return {"task_id": self._task_info["task_id"], "buffer_id": self._task_info["buffer_id"]}

    # what the learner calls
    def get_data(self, batch_size, cur_learner_iter, end):
        self._demand_queue.put({"task_id": self._task_info["task_id"],
                                "buffer_id": self._task_info["buffer_id"],
                                "batch_size": batch_size, "cur_learner_iter": cur_learner_iter})
        while not end.is_set():
            try:
                data = self._result_queue.get(timeout=0.05)
            except queue.Empty:
                continue
            assert isinstance(data, list) and len(data) == batch_size
            return data
        return None

    def send_learn_info(self, info):
        self._learn_info_queue.put(info)
