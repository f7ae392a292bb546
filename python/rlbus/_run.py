"""The broker a run starts for itself, and the run it lives for.

A program on one machine that names no broker ($RLBUS_ENDPOINT) gets a broker of its own
(DI-engine's runner, or a legacy pipeline's coordinator, through :mod:`rlbus.compat`). That
broker must serve every process of the run, and only them, for exactly as long as one of them
lives. So a run is a private folder, made for it alone (mode 0700, under $XDG_RUNTIME_DIR
when that is this user's, else under the temporary folder):

- ``router`` and ``events``: the broker's ``ipc://`` sockets. No other user can reach them,
  and no program that happens to listen on a TCP port is ever taken for the run's broker.
- ``run.lock``: every process of the run holds a shared lock (flock) on it. A forked child
  shares its parent's; a spawned worker gets its parent's through the pickled main function
  (:func:`for_child` / :func:`adopt`), or takes its own when it imports rlbus (the folder is
  named in $RLBUS_RUN_LOCK). The broker (``--run-lock``) stops once no process holds it: the
  kernel lets go of a process's lock however it ends, SIGKILL included.
- ``broker.log``: the broker's output. It never writes to a pipe that a process of the run
  would have to read.

A run is prepared (folder, lock, environment) where its first process decides it, and its
broker is started when a process of the run first needs it (:func:`ensure_broker`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
from typing import Any, Dict, List, Optional, Tuple, cast

from .protocol import DEFAULT_ENDPOINT

__all__ = ["RUN_LOCK_ENV", "ENDPOINT_ENV", "DEFAULT_PORT", "prepare", "ensure_broker", "run_endpoint", "current", "for_child",
           "adopt", "leave", "join_from_environment"]

RUN_LOCK_ENV = "RLBUS_RUN_LOCK"
ENDPOINT_ENV = "RLBUS_ENDPOINT"  # the endpoint a program names without code, read first
DEFAULT_PORT = int(DEFAULT_ENDPOINT.rsplit(":", 1)[1])  # the default endpoint's port
_KEPT_FINISHED = 20  # finished runs' folders kept (their logs), newest first

log = logging.getLogger("rlbus.run")

_lock = threading.Lock()
# The broker this process started last (tests and tools look at it).
last_started: Any = None
# This process's share of its run: the folder and the descriptor holding the shared lock.
_held: Dict[str, Any] = {"dir": None, "fd": None}


def _base_dir() -> str:
    """$XDG_RUNTIME_DIR/rlbus when that folder is this user's and private, else
    <tmp>/rlbus-<uid>; made (0700) when missing; an unsafe existing one is refused."""
    import tempfile
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
            if st.st_uid == uid and stat.S_IMODE(st.st_mode) & 0o077 == 0:
                return _private_dir(os.path.join(runtime, "rlbus"))
        except OSError:
            pass
    return _private_dir(os.path.join(tempfile.gettempdir(), f"rlbus-{uid}"))


def _private_dir(path: str) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() \
            or stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(f"{path} is not a private folder of this user (owner uid "
                              f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it or "
                              f"set $TMPDIR elsewhere")
    return path


def _hold(path: str) -> Optional[int]:
    """A descriptor holding a shared lock on `path`, or None when the run is over (its broker
    holds the lock alone) or the file is gone."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _prune(base: str, keep: str) -> None:
    """Removes the folders of finished runs (nobody holds their lock) past the newest few."""
    finished: List[Tuple[Any, ...]] = []
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if not name.startswith("run-") or path == keep:
            continue
        try:
            fd = os.open(os.path.join(path, "run.lock"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finished.append((os.stat(path).st_mtime, path))
        except OSError:
            pass  # a live run
        finally:
            os.close(fd)
    finished.sort(reverse=True)
    import shutil
    for _, path in finished[_KEPT_FINISHED:]:
        shutil.rmtree(path, ignore_errors=True)


def _broker_gone(folder: str) -> bool:
    """Whether the run's broker was started and has stopped since (the run is over, or the
    broker was killed)."""
    try:
        with open(os.path.join(folder, "broker.pid")) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False  # not started yet
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def current() -> Optional[str]:
    """The folder of the run this process belongs to, or None."""
    return cast(Optional[str], _held["dir"])


def prepare() -> str:
    """Makes this process the first of a new run (unless it already belongs to one) and
    names the run's broker in the environment, for this process and every one it starts.
    Returns the run's folder. Starts no broker (:func:`ensure_broker` does)."""
    with _lock:
        if _held["dir"] is not None:
            return cast(str, _held["dir"])
        import tempfile
        base = _base_dir()
        folder = tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=base)
        lock_path = os.path.join(folder, "run.lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits out another process's _prune looking at it
        _held.update(dir=folder, fd=fd)
        os.environ[ENDPOINT_ENV] = _endpoints(folder)[0]
        os.environ[RUN_LOCK_ENV] = lock_path
        try:
            _prune(base, folder)
        except OSError as exc:  # pragma: no cover - best effort
            log.debug("rlbus: could not prune finished runs in %s (%s)", base, exc)
        return folder


def _endpoints(folder: str) -> Tuple[str, str]:
    return ("ipc://" + os.path.join(folder, "router"), "ipc://" + os.path.join(folder, "events"))


def run_endpoint() -> Optional[str]:
    """The router endpoint of the run this process belongs to, or was started for; None
    when it has nothing to do with a run."""
    folder = current()
    if folder is None and os.environ.get(RUN_LOCK_ENV):
        folder = os.path.dirname(os.environ[RUN_LOCK_ENV])
    return None if folder is None else _endpoints(folder)[0]


def ensure_broker() -> str:
    """The run's broker endpoint, its broker started if no process of the run has yet (the
    first to ask starts it; the others find it). Prepares a run first when this process
    belongs to none and was started for none. RuntimeError when the run this process was
    started for is over, or its broker cannot start (with the broker's output)."""
    global last_started
    if current() is None and os.environ.get(RUN_LOCK_ENV):
        join_from_environment()
        if current() is None:
            raise RuntimeError(f"the run this process was started for "
                               f"({os.path.dirname(os.environ[RUN_LOCK_ENV])}) is over")
    folder = current() or prepare()
    router, events = _endpoints(folder)
    start_lock = os.path.join(folder, "start.lock")
    fd = os.open(start_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one process of the run starts it
        pid_file = os.path.join(folder, "broker.pid")
        if os.path.exists(pid_file):
            if _broker_gone(folder):
                raise RuntimeError(f"the broker of this run has stopped (its log: "
                                   f"{os.path.join(folder, 'broker.log')})")
            return router
        from ._broker import Broker
        log_path = os.path.join(folder, "broker.log")
        broker = Broker(["--run-lock", os.path.join(folder, "run.lock")], router=router,
                        events=events, log_path=log_path, own_session=True).start()
        assert broker.proc is not None  # started
        with open(pid_file, "w") as f:
            f.write(f"{broker.proc.pid}\n")
        last_started = broker
        log.info("rlbus: no broker named ($%s): started one for this run at %s (pid %d); it "
                 "logs to %s and stops when the last process of the run has ended%s",
                 ENDPOINT_ENV, router, broker.proc.pid, log_path, _default_port_note())
        return router
    finally:
        os.close(fd)


def listening(port: int) -> bool:
    """Whether something accepts TCP connections at 127.0.0.1:`port`."""
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _default_port_note() -> str:
    """Says so when something listens at the default endpoint (a broker the user meant, or
    anything else): a run that names no broker never hands its tasks to it."""
    if not listening(DEFAULT_PORT):
        return ""
    return (f"; something listens at {DEFAULT_ENDPOINT} and is not used (name it in "
            f"${ENDPOINT_ENV} to use it)")


def for_child() -> Any:
    """What a worker being spawned needs to share this process's hold on the run (put it in
    what is pickled for the worker; :func:`adopt` takes it there): the descriptor itself, so
    the worker is part of the run from the moment it exists. None outside a spawn, or when
    this process belongs to no run."""
    fd = _held["fd"]
    if fd is None:
        return None
    try:
        from multiprocessing import context, reduction
    except ImportError:  # pragma: no cover
        return None
    if context.get_spawning_popen() is None:
        return None
    return reduction.DupFd(fd)


def adopt(token: Any) -> None:
    """In a spawned worker: keeps the hold :func:`for_child` passed (a process that already
    holds one closes the extra descriptor)."""
    if token is None:
        return
    fd = token.detach()
    with _lock:
        if _held["fd"] is None and os.environ.get(RUN_LOCK_ENV):
            os.set_inheritable(fd, False)
            _held.update(dir=os.path.dirname(os.environ[RUN_LOCK_ENV]), fd=fd)
            return
    os.close(fd)


def join_from_environment() -> None:
    """A process started by a process of a run (named in $RLBUS_RUN_LOCK) becomes part of it
    when it imports rlbus, unless it shares a hold already. A run that is over is said so."""
    path = os.environ.get(RUN_LOCK_ENV)
    if not path:
        return
    with _lock:
        if _held["fd"] is not None:
            return
        fd = _hold(path)
        if fd is not None and _broker_gone(os.path.dirname(path)):
            os.close(fd)
            fd = None
        if fd is None:
            log.warning("rlbus: the run this process was started for (%s) is over: its broker "
                        "has stopped", os.path.dirname(path))
            return
        _held.update(dir=os.path.dirname(path), fd=fd)


def leave() -> None:
    """This process is no longer part of its run (processes it forked keep their share):
    once none is left, the run's broker stops."""
    with _lock:
        fd, folder = _held["fd"], _held["dir"]
        _held.update(fd=None, dir=None)
        if folder is not None and os.environ.get(RUN_LOCK_ENV) == os.path.join(folder,
                                                                                "run.lock"):
            del os.environ[RUN_LOCK_ENV]
            if os.environ.get(ENDPOINT_ENV) == _endpoints(folder)[0]:
                del os.environ[ENDPOINT_ENV]
    if fd is not None:
        os.close(fd)  # never LOCK_UN: that would let go of every share of the descriptor
