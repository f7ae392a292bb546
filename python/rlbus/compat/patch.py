"""patch_dingengine(): make an installed DI-engine use rlbus, in both of its distributed modes.

DI-engine's current framework (ding.framework, "ditask") gets the rlbus message queue as
mq_type "rlbus" (rlbus.compat.ditask). For its legacy parallel mode:

DI-engine binds the classes this layer replaces at import time: the comm collector and
learner slaves subclass ding.interaction.Slave when their modules are imported, and
ding.worker.coordinator.coordinator imports CommCoordinator into its own namespace. So the
order matters: first ding.interaction (and ding.interaction.slave) get the rlbus Slave,
then the coordinator module is imported (which imports the comm classes, now built on the
rlbus Slave) and its CommCoordinator name is swapped. Call it before anything imports
ding.worker. Without DI-engine installed it does nothing and returns False.

A legacy run on one machine needs no broker set up: when no broker is named ($RLBUS_ENDPOINT),
patch_dingengine() makes this process the first of a run of its own (rlbus._run) and names
the run's broker in the environment, which the workers parallel_pipeline forks afterwards
inherit. The broker itself is started when the coordinator or a worker first needs it, and
it stops once the last process of the run has ended. Whatever listens at the default
endpoint is never taken for it.
"""

import importlib
import importlib.util
import logging
import os
import sys

from .. import _run
from ._util import ENDPOINT_ENV
from .coordinator import CommCoordinator
from .slave import Slave

log = logging.getLogger("rlbus.compat")

_SLAVE_MODULES = ("ding.interaction", "ding.interaction.slave")
_COORDINATOR_MODULES = ("ding.worker.coordinator.coordinator",
                        "ding.worker.coordinator.comm_coordinator")
# Modules whose classes subclass Slave at import time.
_COMM_MODULES = ("ding.worker.collector.comm.flask_fs_collector",
                 "ding.worker.learner.comm.flask_fs_learner",
                 "ding.worker.collector.comm.utils",
                 "ding.worker.learner.comm.utils")

_saved = {}  # (module, name) -> original value


def _swap(module, name, value):
    key = (module.__name__, name)
    current = getattr(module, name, None)
    if current is value:
        return
    _saved.setdefault(key, current)
    setattr(module, name, value)


def _try_import(name):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        log.debug("patch_dingengine: %s not importable (%s)", name, exc)
        return None


def _has_module(name):
    """Whether `name` can be imported, without importing it (ding.worker must not be
    imported before the Slave is swapped)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def patch_dingengine(local_broker=True):
    """Installs the rlbus MQ (mq_type "rlbus") into an importable `ding.framework`, and the
    rlbus Slave and CommCoordinator into its legacy parallel mode; with `local_broker`, for
    the legacy mode, a run of its own with a broker started at first use when none is named
    (see the module's doc).

    Returns True when either took (ditask can use mq_type "rlbus", or DI-engine's coordinator
    now builds the rlbus CommCoordinator), False when there is no DI-engine (nothing is
    changed then). Idempotent."""
    if _try_import("ding") is None:
        return False
    from . import ditask
    framework = ditask.install()
    if not _has_module("ding.interaction") and not _has_module("ding.worker"):
        return framework  # a DI-engine without the legacy parallel mode
    late = [m for m in _COMM_MODULES if m in sys.modules]
    if late:
        log.warning("patch_dingengine: %s already imported; classes there keep the HTTP "
                    "Slave base (call patch_dingengine() before importing ding.worker)",
                    ", ".join(late))
    patched = False
    for name in _SLAVE_MODULES:
        module = _try_import(name)
        if module is not None and hasattr(module, "Slave"):
            _swap(module, "Slave", Slave)
            patched = True
    if not patched:
        log.warning("patch_dingengine: ding.interaction has no Slave to replace")
    swapped = False
    for name in _COORDINATOR_MODULES:
        module = _try_import(name)
        if module is not None and hasattr(module, "CommCoordinator"):
            _swap(module, "CommCoordinator", CommCoordinator)
            swapped = True
    if not swapped:
        log.warning("patch_dingengine: no CommCoordinator found to replace")
    if swapped and local_broker and not os.environ.get(ENDPOINT_ENV):
        folder = _run.prepare()
        log.debug("patch_dingengine: no broker named ($%s); this run's starts at first use, "
                  "in %s", ENDPOINT_ENV, folder)
    return swapped or framework


def unpatch_dingengine():
    """Puts back what patch_dingengine() replaced (classes built meanwhile keep theirs); this
    process leaves the run patch_dingengine() made, if any (its broker stops once no process
    of the run is left)."""
    _run.leave()
    for (modname, name), value in list(_saved.items()):
        module = sys.modules.get(modname)
        if module is not None:
            setattr(module, name, value)
    _saved.clear()
