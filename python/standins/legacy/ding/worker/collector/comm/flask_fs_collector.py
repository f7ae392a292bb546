"""A comm collector shaped like DI-engine's FlaskFileSystemCollector, without torch or envs.

The Slave subclass forwards each step to a callback of the comm collector; the collector
runs its "parallel collector" on a thread that pushes metadata into an 8-slot queue, and
the data step blocks until one is there (polling, with no timeout, as DI-engine's does).
The close step returns the finish info plus task_id.
"""

import os
import queue
import threading
import time

from ding.interaction import Slave, TaskFail


class CollectorSlave(Slave):

    def __init__(self, *args, callback_fn, **kwargs):
        super().__init__(*args, **kwargs)
        self._callback_fn = callback_fn

    def _process_task(self, task):
        name = task["name"]
        if name == "resource":
            return self._callback_fn["deal_with_resource"]()
        if name == "collector_start_task":
            self._callback_fn["deal_with_collector_start"](task["task_info"])
            return {"message": "collector task has started"}
        if name == "collector_data_task":
            return self._callback_fn["deal_with_collector_data"]()
        if name == "collector_close_task":
            return self._callback_fn["deal_with_collector_close"]()
        raise TaskFail(result={"message": "task name error"},
                       message="illegal collector task <{}>".format(name))


class _ParallelCollector:
    """Produces `n_sample` data items (files under path_data), then a collector_done info."""

    def __init__(self, task_info, send_metadata, path_data, n_sample):
        self.task_info = task_info
        self.send_metadata = send_metadata
        self.path_data = path_data
        self.n_sample = n_sample
        self.end = threading.Event()
        self.produced = 0

    def start(self):
        for n in range(1, self.n_sample + 1):
            if self.end.is_set():
                return
            data_id = "env_{}_{}".format(self.task_info["task_id"], n)
            with open(os.path.join(self.path_data, data_id), "w") as f:
                f.write("trajectory\n")
            self.send_metadata({"data_id": data_id, "policy_iter": 0, "eval_flag": False,
                                "env_id": n % 2, "unroll_len": 1, "compressor": "none",
                                "get_data_time": time.time(), "priority": 1.0,
                                "cur_episode": 0, "cur_sample": n, "cur_step": n})
            self.produced += 1
        self.send_metadata({"collector_done": True, "cur_episode": 1,
                            "cur_sample": self.n_sample, "cur_step": self.n_sample,
                            "eval_flag": False, "get_info_time": time.time()})
        self.end.wait()  # an idle collector, until closed

    def get_finish_info(self):
        return {"eval_flag": False, "env_num": 2, "collector_done": True,
                "sample_count": self.produced, "reward_mean": 1.0, "reward_raw": [1.0, 1.0]}

    def close(self):
        self.end.set()


class FlaskFileSystemCollector:

    def __init__(self, cfg):
        self._cfg = cfg
        self._path_data = cfg["path_data"]
        self._n_sample = cfg.get("n_sample", 6)
        self._metadata_queue = queue.Queue(8)
        self._collector = None
        self._collector_thread = None
        self._current_task_info = None
        self._slave = CollectorSlave(cfg["host"], cfg["port"], callback_fn={
            "deal_with_resource": self.deal_with_resource,
            "deal_with_collector_start": self.deal_with_collector_start,
            "deal_with_collector_data": self.deal_with_collector_data,
            "deal_with_collector_close": self.deal_with_collector_close,
        })

    def start(self):
        self._slave.start()

    def close(self):
        if self._collector is not None:
            self._collector.close()
        self._slave.close()

    def deal_with_resource(self):
        return {"gpu": 1, "cpu": 20}

    def deal_with_collector_start(self, task_info):
        self._current_task_info = task_info
        self._collector = _ParallelCollector(task_info, self.send_metadata, self._path_data,
                                             self._n_sample)
        self._collector_thread = threading.Thread(target=self._collector.start, daemon=True)
        self._collector_thread.start()

    def deal_with_collector_data(self):
        while True:
            if not self._metadata_queue.empty():
                return self._metadata_queue.get()
            time.sleep(0.1)

    def deal_with_collector_close(self):
        finish_info = self._collector.get_finish_info()
        self._collector.close()
        self._collector_thread.join()
        self._collector = None
        finish_info["task_id"] = self._current_task_info["task_id"]
        return finish_info

    def send_metadata(self, metadata):
        metadata = dict(metadata)
        metadata["buffer_id"] = self._current_task_info["buffer_id"]
        metadata["task_id"] = self._current_task_info["task_id"]
        self._metadata_queue.put(metadata)
