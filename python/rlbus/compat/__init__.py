"""rlbus.compat: DI-engine's parallel-mode interfaces over the rlbus broker.

- CommCoordinator: drop-in for ding.worker.coordinator.comm_coordinator.CommCoordinator.
- Slave: drop-in for ding.interaction.Slave (comm collector/learner slaves, test doubles).
- patch_dingengine(): installs both into an importable DI-engine, as its modules are imported.

CommCoordinator and Slave are imported on first use.

See python/README.md for configuration and the differences from DI-engine's HTTP mode.
"""

from typing import Any

from ._util import DEFAULT_ENDPOINT, ENDPOINT_ENV, coerce_resources, resolve_endpoint
from .exceptions import ConnectionRefuse, DisconnectionRefuse, TaskFail, TaskRefuse
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
        from .coordinator import CommCoordinator
        return CommCoordinator
    if name == "Slave":
        from .slave import Slave
        return Slave
    raise AttributeError(f"module 'rlbus.compat' has no attribute {name!r}")
