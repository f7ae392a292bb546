"""NaiveLearner: the learner test double (non-numeric resources, batch 2, done from the
6th learn on, writes <prefix>_final_model.pth, close answers {task_id, buffer_id})."""

import time

from ding.interaction import Slave, TaskFail


class NaiveLearner(Slave):

    def __init__(self, *args, prefix="", **kwargs):
        super().__init__(*args, **kwargs)
        self._prefix = prefix
        self._count = 0
        self._task_id = None
        self._buffer_id = None

    def _process_task(self, task):
        name = task["name"]
        if name == "resource":
            return {"cpu": "xxx", "gpu": "xxx"}
        if name == "learner_start_task":
            time.sleep(0.2)  # building a learner takes a while
            self._count = 0
            info = task["task_info"]
            self._task_id, self._buffer_id = info["task_id"], info["buffer_id"]
            return {"message": "learner task has started"}
        if name == "learner_get_data_task":
            return {"task_id": self._task_id, "buffer_id": self._buffer_id, "batch_size": 2,
                    "cur_learner_iter": 1}
        if name == "learner_learn_task":
            data = task["data"]
            assert all("data_id" in d for d in data), data
            self._count += 1
            done = self._count >= 6
            if done:
                with open(self._prefix + "_final_model.pth", "w") as f:
                    f.write("model\n")
            info = {
                "learner_step": self._count,
                "priority_info": {
                    "priority": [1.0 for _ in data],
                    "replay_buffer_idx": [d.get("replay_buffer_idx") for d in data],
                    "replay_unique_id": [d.get("replay_unique_id") for d in data],
                },
                "learner_done": done,
            }
            return {"info": info, "buffer_id": self._buffer_id, "task_id": self._task_id}
        if name == "learner_close_task":
            return {"task_id": self._task_id, "buffer_id": self._buffer_id}
        raise TaskFail(result={"message": "task name error"}, message="illegal learner task")
