"""A step's context in the shape of DI-engine 0.5's (ding/framework/context.py): a dataclass
whose fields are attributes, with no dict methods (``ctx.get`` does not exist there, so code
run over this stand-in must not use it either). ``renew()`` makes the next step's context of
the same class, carrying over the fields named with ``keep()`` and counting ``total_step`` on.
``OnlineRLContext`` has the fields DI-engine's online pipelines and ``ContextExchanger`` use,
and keeps the counters across steps."""

import dataclasses
import math
from typing import Any


@dataclasses.dataclass
class Context:
    _kept_keys: set = dataclasses.field(default_factory=set)
    total_step: int = 0

    def renew(self) -> "Context":
        following = type(self)()
        for key in self._kept_keys:
            if hasattr(self, key):
                setattr(following, key, getattr(self, key))
        following.total_step = self.total_step + 1
        return following

    def keep(self, *keys: str) -> None:
        self._kept_keys.update(keys)

    def has_attr(self, key: str) -> bool:
        return hasattr(self, key)


@dataclasses.dataclass
class OnlineRLContext(Context):
    env_step: int = 0
    env_episode: int = 0
    train_iter: int = 0
    train_data: Any = None
    train_output: Any = None
    collect_kwargs: dict = dataclasses.field(default_factory=dict)
    obs: Any = None
    action: Any = None
    inference_output: Any = None
    trajectories: Any = None
    episodes: Any = None
    trajectory_end_idx: list = dataclasses.field(default_factory=list)
    eval_value: float = -math.inf
    last_eval_iter: int = -1
    last_eval_value: float = -math.inf
    eval_output: Any = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keep("env_step", "env_episode", "train_iter", "last_eval_iter", "last_eval_value")
