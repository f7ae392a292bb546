"""rlbus: the Python client of the rlbus message bus (protocol v1).

- :mod:`rlbus.protocol`: the codec, driven by ``protocol/messages.json``.
- :class:`Worker`: a collector or learner process taking tasks from the broker; its
  handlers get a :class:`Task`.
- :class:`Coordinator`: submits tasks and receives their events in order, exactly once.
- :class:`Bus`: publish and subscribe on the broker's topic bus, lossless and in order.
- :func:`find_broker` / :class:`Broker`: the broker binary, and one started for a program.
- :class:`CurveKeys` / :func:`curve_keys_from_files`: keys for a broker with CURVE on.
- :mod:`rlbus.compat`: DI-engine's parallel-mode classes running over rlbus.

``python3 -m rlbus`` says which version this is, which broker it finds and which endpoint a
program would use.

``Worker``, ``Task`` and ``Coordinator`` are imported on first use, so ``import rlbus`` for
the codec alone does not load the client machinery.
"""

import os as _os
from typing import Any

from ._data import data_file as _data_file



def _version() -> str:
    """The VERSION file at the top of a source checkout, or the copy setup.py puts in the
    package: the one place of the version, which the C++ build reads too."""
    path = _data_file("VERSION")
    if path is not None:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    raise ImportError("rlbus: no VERSION file: run from a source checkout or install the "
                      "package (setup.py copies it in)")


__version__ = _version()

from . import protocol
from ._keys import CurveKeys, curve_keys_from_files
from ._types import Policy, SubmitResult, TaskFailure
from .protocol import DEFAULT_ENDPOINT, ProtocolError

if _os.environ.get("RLBUS_RUN_LOCK"):  # a process started by a process of a run joins it
    from . import _run
    _run.join_from_environment()

__all__ = ["__version__", "protocol", "DEFAULT_ENDPOINT", "ProtocolError", "Policy", "SubmitResult", "TaskFailure",
           "CurveKeys", "curve_keys_from_files", "Worker", "Task", "Coordinator", "Bus",
           "BusMessage", "BusError", "Broker", "find_broker", "free_port"]


def __getattr__(name: str) -> Any:
    if name == "Worker":
        from .worker import Worker
        return Worker
    if name == "Task":
        from ._task import Task
        return Task
    if name == "Coordinator":
        from .coordinator import Coordinator
        return Coordinator
    if name in ("Bus", "BusMessage", "BusError"):
        from . import bus
        return getattr(bus, name)
    if name in ("Broker", "find_broker", "free_port"):
        from . import _broker
        return getattr(_broker, name)
    raise AttributeError(f"module 'rlbus' has no attribute {name!r}")
