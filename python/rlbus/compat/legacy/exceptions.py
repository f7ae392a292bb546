"""Exceptions of DI-engine's Slave hooks, with the same constructor shapes.

A Slave subclass written for DI-engine raises these (or DI-engine's own classes of the
same names, which the compat Slave recognises by name) from its hooks and _process_task.
"""

from typing import Any, Dict, Optional


class SlaveActionError(Exception):
    """Base of the exceptions a Slave's hooks raise: a message and an optional data dict."""

    def __init__(self, message: Optional[str] = None,
                 data: Optional[Dict[str, Any]] = None) -> None:
        Exception.__init__(self, message)
        self.message = message
        self.data = data or {}


class ConnectionRefuse(SlaveActionError):
    """Raised by _before_connection: this slave does not join the broker."""


class DisconnectionRefuse(SlaveActionError):
    """Raised by _before_disconnection (logged; a local shutdown still goes ahead)."""


class TaskRefuse(SlaveActionError):
    """Raised by _before_task: the step is refused and the attempt fails."""


class TaskFail(Exception):
    """Raised by _process_task: the step fails with a result dict and a message."""

    def __init__(self, result: Optional[Dict[str, Any]] = None,
                 message: Optional[str] = None) -> None:
        Exception.__init__(self, message)
        self.result = result or {}
        self.message = message


def is_task_fail(exc: BaseException) -> bool:
    """True for our TaskFail and for DI-engine's class of that name (duck-typed)."""
    return any(cls.__name__ == "TaskFail" for cls in type(exc).__mro__)


def is_named(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(exc).__mro__)
