"""Finding and starting an rlbus broker from Python: :func:`find_broker`, :class:`Broker` and
:func:`free_port` for a broker (or anything else a test starts) on a port of its own.

A program on one machine that names no broker gets one of its own this way (the embedded
broker of :mod:`rlbus.compat.ditask`); tests start theirs with it too.
"""

from __future__ import annotations

import functools
import os
import random
import re
import shutil
import socket
import subprocess
import threading
import time
from typing import Any, List, Optional, Sequence

__all__ = ["find_broker", "free_port", "Broker", "BROKER_ENV"]

BROKER_ENV = "RLBUS_BROKER"
_BUILD_ENV = "RLBUS_BUILD_DIR"
_KEPT_LINES = 10_000  # of the broker's output, the latest (Broker.lines)
_LISTENING = re.compile(r"^rlbus-broker listening router=(\S+) events=(\S+)")


def _candidates() -> List[str]:
    """Where the broker binary may be, in the order tried."""
    out: List[str] = []
    explicit = os.environ.get(BROKER_ENV)
    if explicit:
        out.append(explicit)
    on_path = shutil.which("rlbus-broker")
    if on_path:
        out.append(on_path)
    build = os.environ.get(_BUILD_ENV)
    if build:
        out.append(os.path.join(build, "src", "rlbus-broker"))
    # a build tree beside this source checkout (python/rlbus/ -> ../../build)
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(os.path.join(here, "..", "..", "build", "src", "rlbus-broker"))
    return out


def find_broker() -> str:
    """The path of the rlbus-broker binary: $RLBUS_BROKER, then PATH, then
    $RLBUS_BUILD_DIR/src, then a build tree beside this source checkout. FileNotFoundError
    naming every place tried when none holds an executable, or when $RLBUS_BROKER names one
    that is not."""
    explicit = os.environ.get(BROKER_ENV)
    if explicit and not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
        raise FileNotFoundError(f"${BROKER_ENV} names {explicit}, which is not an executable "
                                f"file")
    tried = _candidates()
    for path in tried:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.normpath(path)
    raise FileNotFoundError(
        "no rlbus-broker binary found; tried: " + ", ".join(os.path.normpath(p) for p in tried)
        + f" (set ${BROKER_ENV} to the binary, or install the broker on PATH)")


def free_port() -> int:
    """A loopback TCP port nothing listens on now, drawn between 10000 and the start of the
    kernel's range of ephemeral ports (at most 30000), as fixed ports such as 7235 are.

    A port of the ephemeral range, found free, can be taken before its server binds it by any
    socket that connects meanwhile; and a peer reconnecting to such a port while its broker is
    down can be given that very port and connect to itself, holding it. Below the range
    neither happens. Another process may still bind the port first: unlikely, and the bind
    then fails clearly."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for _ in range(10_000):
        port = random.randrange(10000, max(10001, min(low, 30000)))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free loopback port between 10000 and the ephemeral range")


class Broker:
    """A broker process of our own, on free loopback ports unless told otherwise.

    ``with Broker() as b:`` starts it and waits until it listens (its start-up line names the
    endpoints it bound: :attr:`router`, :attr:`events`); leaving the block stops it (SIGTERM,
    then SIGKILL after ``stop_timeout`` seconds). ``args`` are extra broker flags.

    With ``log_path`` its output goes to that file (appended) instead of a pipe this process
    reads, so it never waits on a reader that is gone; with ``own_session`` it is not in this
    process's session (a Ctrl-C or a hangup of the terminal does not reach it)."""

    def __init__(self, args: Sequence[str] = (), *, router: str = "tcp://127.0.0.1:0",
                 events: str = "tcp://127.0.0.1:0", binary: Optional[str] = None,
                 start_timeout: float = 10.0, stop_timeout: float = 10.0,
                 log_path: Optional[str] = None, own_session: bool = False) -> None:
        self.binary = binary or find_broker()
        self.args = list(args)
        self.router = router
        self.events = events
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.log_path = log_path
        self.own_session = own_session
        self.lines: List[str] = []
        self.proc: Optional["subprocess.Popen[Any]"] = None
        self._listening = threading.Event()

    def start(self) -> "Broker":
        if self.proc is not None and self.proc.poll() is None:
            return self
        extra = self.args if "--drain-ms" in self.args else ["--drain-ms", "0"] + self.args
        cmd = [self.binary, "--router", self.router, "--events", self.events] + extra
        self.lines = []
        self._listening.clear()
        if self.log_path is None:
            proc: "subprocess.Popen[Any]" = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                text=True, start_new_session=self.own_session)
            threading.Thread(target=self._read, args=(proc,), daemon=True,
                             name="rlbus-broker-output").start()
            wait = self._listening.wait
        else:
            with open(self.log_path, "ab") as out:
                start = out.tell()
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL,
                                        start_new_session=self.own_session)
            wait = functools.partial(self._read_log, start)
        self.proc = proc
        deadline = time.monotonic() + self.start_timeout
        while not wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                if self.log_path is not None:
                    self._read_log(start, 0)
                raise RuntimeError("rlbus-broker did not start: " + "".join(self.lines[-20:]))
        return self

    def _read_log(self, start: int, pause: float) -> bool:
        """Reads the log file from `start` into :attr:`lines`; whether it says the broker
        listens (waiting `pause` seconds first when not)."""
        assert self.log_path is not None
        with open(self.log_path, "r", errors="replace") as f:
            f.seek(start)
            self.lines = f.readlines()[-_KEPT_LINES:]
        for line in self.lines:
            m = _LISTENING.match(line)
            if m:
                self.router, self.events = m.group(1), m.group(2)
                return True
        time.sleep(pause)
        return False

    def _read(self, proc: "subprocess.Popen[str]") -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)
            if len(self.lines) > 2 * _KEPT_LINES:  # the latest lines, bounded
                del self.lines[:-_KEPT_LINES]
            m = _LISTENING.match(line)
            if m and not self._listening.is_set():
                self.router, self.events = m.group(1), m.group(2)
                self._listening.set()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stops the broker; idempotent."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(self.stop_timeout)

    def kill(self) -> None:
        """SIGKILLs the broker: it says goodbye to no one, as a crash would. :meth:`start`
        brings it back on the same endpoints."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(self.stop_timeout)

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
