"""rlbus.compat: DI-engine's parallel-mode interfaces over the rlbus broker.

- CommCoordinator: drop-in for ding.worker.coordinator.comm_coordinator.CommCoordinator.
- Slave: drop-in for ding.interaction.Slave (comm collector/learner slaves, test doubles).
- patch_dingengine(): installs both into an importable DI-engine.

See python/README.md for configuration and the differences from DI-engine's HTTP mode.
"""

from ._util import DEFAULT_ENDPOINT, ENDPOINT_ENV, coerce_resources, resolve_endpoint
from .coordinator import CommCoordinator
from .exceptions import ConnectionRefuse, DisconnectionRefuse, TaskFail, TaskRefuse
from .patch import patch_dingengine, unpatch_dingengine
from .slave import Slave

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
