"""patch_dingengine(): make an installed DI-engine use rlbus, in both of its distributed modes.

DI-engine's current framework (ding.framework, "ditask") gets the rlbus message queue as
mq_type "rlbus" (rlbus.compat.ditask). For its legacy parallel mode:

DI-engine binds the classes this layer replaces at import time: the comm collector and
learner slaves subclass ding.interaction.Slave when their modules are imported, and
ding.worker.coordinator.coordinator imports CommCoordinator into its own namespace. So the
rlbus Slave must be in ding.interaction (and ding.interaction.slave) before any comm module
is imported, and the rlbus CommCoordinator in the coordinator modules before anything builds
one. patch_dingengine() imports none of them: it swaps the class in a module as soon as that
module has been executed, when the process first imports it (or at once, for a module already
imported). A ditask process, which never imports DI-engine's legacy workers, pays nothing for
them. Call it before anything imports ding.worker. Without DI-engine installed it does
nothing and returns False.

A legacy run on one machine needs no broker set up: when no broker is named ($RLBUS_ENDPOINT),
patch_dingengine() makes this process the first of a run of its own (rlbus._run) and names
the run's broker in the environment, which the workers parallel_pipeline forks afterwards
inherit. The broker itself is started when the coordinator or a worker first needs it, and
it stops once the last process of the run has ended. Whatever listens at the default
endpoint is never taken for it.
"""

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple, Type

from .. import _run
from ._util import ENDPOINT_ENV

if TYPE_CHECKING:
    from .legacy.coordinator import CommCoordinator
    from .legacy.slave import Slave

log = logging.getLogger("rlbus.compat")


def _slave() -> "Type[Slave]":
    from .legacy.slave import Slave
    return Slave


def _comm_coordinator() -> "Type[CommCoordinator]":
    from .legacy.coordinator import CommCoordinator
    return CommCoordinator


# Module -> (the name swapped in it, what replaces it).
_SWAPS: Dict[str, Tuple[str, Callable[[], type]]] = {
    "ding.interaction": ("Slave", _slave),
    "ding.interaction.slave": ("Slave", _slave),
    "ding.worker.coordinator.coordinator": ("CommCoordinator", _comm_coordinator),
    "ding.worker.coordinator.comm_coordinator": ("CommCoordinator", _comm_coordinator),
}
# Modules whose classes subclass Slave at import time.
_COMM_MODULES = ("ding.worker.collector.comm.flask_fs_collector",
                 "ding.worker.learner.comm.flask_fs_learner",
                 "ding.worker.collector.comm.utils",
                 "ding.worker.learner.comm.utils")

_saved: Dict[Tuple[str, str], Any] = {}  # (module, name) -> original value
_lock = threading.RLock()


def _swap(module: ModuleType) -> None:
    """Puts the rlbus class into `module` (one of _SWAPS), once it has been executed."""
    name, replacement = _SWAPS[module.__name__]
    value = replacement()
    with _lock:
        current = getattr(module, name, None)
        if current is value:
            # imported from a module swapped before (the coordinator's comm_coordinator):
            # what unpatch puts back is that module's original
            original = next((v for (_, n), v in _saved.items() if n == name), None)
            _saved.setdefault((module.__name__, name), original)
            return
        if current is None:
            log.warning("patch_dingengine: %s has no %s to replace", module.__name__, name)
        _saved.setdefault((module.__name__, name), current)
        setattr(module, name, value)


class _SwapAfterExec(importlib.abc.Loader):
    """The loader of one of _SWAPS's modules: the module's own, then the swap."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: ModuleSpec) -> Optional[ModuleType]:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _swap(module)

    # get_data, get_filename, is_package ... as the module's own
    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds _SWAPS's modules as the finders after it would, and has them swapped once
    executed."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[ModuleSpec]:
        if fullname not in _SWAPS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _SwapAfterExec(spec.loader)
                return spec
        return None


_finder = _Finder()


def _try_import(name: str) -> Optional[ModuleType]:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        log.debug("patch_dingengine: %s not importable (%s)", name, exc)
        return None


def _has_module(name: str) -> bool:
    """Whether `name` can be imported, without importing it (only its parent package)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def patch_dingengine(local_broker: bool = True) -> bool:
    """Installs the rlbus MQ (mq_type "rlbus") into an importable `ding.framework`, and the
    rlbus Slave and CommCoordinator into its legacy parallel mode as its modules are imported;
    with `local_broker`, for the legacy mode, a run of its own with a broker started at first
    use when none is named (see the module's doc).

    Returns True when either took (ditask can use mq_type "rlbus", or DI-engine's legacy mode
    will build the rlbus classes), False when there is no DI-engine (nothing is changed then).
    Idempotent."""
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
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        for name in _SWAPS:  # what was imported before
            module = sys.modules.get(name)
            if module is not None:
                _swap(module)
    if local_broker and not os.environ.get(ENDPOINT_ENV):
        folder = _run.prepare()
        log.debug("patch_dingengine: no broker named ($%s); this run's starts at first use, "
                  "in %s", ENDPOINT_ENV, folder)
    return True


def unpatch_dingengine() -> None:
    """Puts back what patch_dingengine() replaced (classes built meanwhile keep theirs) and
    stops swapping modules imported later; this process leaves the run patch_dingengine()
    made, if any (its broker stops once no process of the run is left)."""
    _run.leave()
    with _lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        for (modname, name), value in list(_saved.items()):
            module = sys.modules.get(modname)
            if module is not None:
                setattr(module, name, value)
        _saved.clear()
