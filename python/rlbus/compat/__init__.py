"""rlbus.compat: DI-engine over the rlbus broker, in both of its distributed generations.

- :mod:`rlbus.compat.legacy`, the parallel mode: CommCoordinator, the drop-in for
  ding.worker.coordinator.comm_coordinator.CommCoordinator, and Slave, the drop-in for
  ding.interaction.Slave (comm collector/learner slaves, test doubles).
- :mod:`rlbus.compat.ditask`, the current framework (ding.framework): the message queue of
  mq_type "rlbus".
- patch_dingengine() (:mod:`rlbus.compat.patch`): installs them into an importable DI-engine,
  as its modules are imported.

CommCoordinator and Slave are imported on first use.

See python/README.md for configuration and the differences from DI-engine's HTTP mode.
"""

from typing import Any

from ._util import DEFAULT_ENDPOINT, ENDPOINT_ENV, coerce_resources, resolve_endpoint
from .legacy.exceptions import ConnectionRefuse, DisconnectionRefuse, TaskFail, TaskRefuse
from .patch import patch_dingengine, unpatch_dingengine

__all__ = [
    "CommCoordinator",
    "ConnectionRefuse",
    "DEFAULT_ENDPOINT",
    "DisconnectionRefuse",
    "ENDPOINT_ENV",
    "Slave",
    "TaskFail",
    "TaskRefuse",
    "coerce_resources",
    "patch_dingengine",
    "resolve_endpoint",
    "unpatch_dingengine",
]


def __getattr__(name: str) -> Any:
    # The legacy classes (and the client machinery under them) load on first use: a ditask
    # process that only calls patch_dingengine() never imports them.
    if name == "CommCoordinator":
        from .legacy.coordinator import CommCoordinator
        return CommCoordinator
    if name == "Slave":
        from .legacy.slave import Slave
        return Slave
    raise AttributeError(f"module 'rlbus.compat' has no attribute {name!r}")
