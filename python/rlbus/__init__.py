"""rlbus: the Python client of the rlbus message bus (protocol v1).

- :mod:`rlbus.protocol`: the codec, driven by ``protocol/messages.json``.
- :class:`Worker`: a collector or learner process taking tasks from the broker.
- :class:`Coordinator`: submits tasks and receives their events in order, exactly once.
- :mod:`rlbus.compat`: DI-engine's parallel-mode classes running over rlbus.

``Worker`` and ``Coordinator`` are imported on first use, so ``import rlbus`` for the codec
alone does not load the client machinery.
"""

from typing import Any

from . import protocol
from ._types import Policy, SubmitResult, TaskFailure
from .protocol import ProtocolError

__all__ = ["protocol", "ProtocolError", "Policy", "SubmitResult", "TaskFailure",
           "Worker", "Coordinator"]


def __getattr__(name: str) -> Any:
    if name == "Worker":
        from .worker import Worker
        return Worker
    if name == "Coordinator":
        from .coordinator import Coordinator
        return Coordinator
    raise AttributeError(f"module 'rlbus' has no attribute {name!r}")
