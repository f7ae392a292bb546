"""Plain value types shared by the Worker and the Coordinator."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional


class Policy(NamedTuple):
    """One version of a policy as the broker hands it to a task: a reference the worker
    resolves itself (a checkpoint path, a URL), or the parameters inline, or both."""

    id: str
    version: int
    ref: Optional[str] = None
    params: Optional[bytes] = None


class SubmitResult(NamedTuple):
    """The broker's answer to a SUBMIT: accepted or refused with a code and a reason;
    ``queued`` is true when no worker could take the task at once."""

    task_id: str
    accepted: bool
    code: int
    reason: str
    queued: bool


class TaskFailure(Exception):
    """Raised from a worker's ``run`` or ``close`` to fail the attempt on purpose.

    ``reason`` reaches the coordinator's ``on_task_requeued`` / ``on_task_failed``;
    ``result`` (a map, optional) travels with it verbatim."""

    def __init__(self, reason: str, result: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.result = result
