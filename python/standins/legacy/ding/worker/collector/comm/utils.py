"""NaiveCollector: the collector test double (string resources, 20 data steps, the 20th an
info with collector_done, every other step name - the close included - fails)."""

import threading

from ding.interaction import Slave, TaskFail


class NaiveCollector(Slave):
    starts = 0  # start steps seen by all instances (a re-run would show here)
    _starts_lock = threading.Lock()

    def __init__(self, *args, prefix="", **kwargs):
        super().__init__(*args, **kwargs)
        self._prefix = prefix
        self._count = 0
        self._task_id = None
        self._buffer_id = None
        self.start_infos = []

    def _process_task(self, task):
        name = task["name"]
        if name == "resource":
            return {"cpu": "20", "gpu": "1"}
        if name == "collector_start_task":
            with NaiveCollector._starts_lock:
                NaiveCollector.starts += 1
            self._count = 0
            info = task["task_info"]
            self.start_infos.append(info)
            self._task_id, self._buffer_id = info["task_id"], info["buffer_id"]
            return {"message": "collector task has started"}
        if name == "collector_data_task":
            self._count += 1
            data_id = "{}_{}_{}".format(self._prefix, self._task_id, self._count)
            with open(data_id, "w") as f:
                f.write("transition %d\n" % self._count)
            if self._count == 20:
                return {"collector_done": True, "cur_episode": 1, "cur_sample": 19,
                        "cur_step": 20, "buffer_id": self._buffer_id, "task_id": self._task_id}
            return {"data_id": data_id, "buffer_id": self._buffer_id, "unroll_split_begin": 0,
                    "task_id": self._task_id}
        raise TaskFail(result={"message": "task name error"}, message="illegal collector task")
