"""Reliable data (SPEC §12.11): what a worker sent of an attempt's indexed sequence (DATA,
INFO, LEARN_INFO) and the broker has not yet confirmed.

Every indexed item carries its index within the attempt. An :class:`Unconfirmed` buffer keeps
each one sent until a DATA_ACK confirms it, within a bound of items and bytes; past the bound
the oldest are let go of. After the session resumes, or when the broker asks, everything kept
goes again (the broker drops duplicates), after a DATA_LOST that declares what was let go of
(§12.11.8): a loss reaches the coordinator and is never silent.

The buffer belongs to the worker's I/O thread; it sends nothing itself: the worker puts what
:meth:`Unconfirmed.take_resend` gives back at the front of its outbox.
"""

from __future__ import annotations

import collections
from typing import Any, Deque, List, Mapping, Tuple

from . import protocol as P

__all__ = ["INDEXED", "Unconfirmed"]

#: The messages of an attempt's indexed sequence (SPEC §12.11.10).
INDEXED = ("DATA", "INFO", "LEARN_INFO")


class Unconfirmed:
    """The indexed items of one attempt that were sent and not confirmed, oldest first."""

    __slots__ = ("max_items", "max_bytes", "_kept", "_bytes", "confirmed", "_dropped_upto")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        # (index, message name, fields, body size) of each item sent, not confirmed
        self._kept: Deque[Tuple[int, str, Any, int]] = collections.deque()
        self._bytes = 0
        self.confirmed = 0       # the index DATA_ACK relayed up to
        self._dropped_upto = 0   # the last index let go of before it was confirmed

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def kept_bytes(self) -> int:
        """The bytes of the bodies kept."""
        return self._bytes

    def sent(self, name: str, fields: Mapping[str, Any]) -> int:
        """A message of the attempt just left: an indexed item is kept until confirmed.
        Returns how many older items were let go of to stay within the bounds."""
        if name not in INDEXED:
            return 0
        size = len(P.encode_body(name, fields))  # the body it was sent as
        self._kept.append((fields["index"], name, fields, size))
        self._bytes += size
        dropped = 0
        while len(self._kept) > self.max_items or (self._bytes > self.max_bytes
                                                   and len(self._kept) > 1):
            index, _, _, gone = self._kept.popleft()
            self._bytes -= gone
            self._dropped_upto = index
            dropped += 1
        return dropped

    def confirm(self, relayed: int) -> None:
        """DATA_ACK: the broker relayed every item up to index ``relayed``."""
        self.confirmed = max(self.confirmed, relayed)
        while self._kept and self._kept[0][0] <= self.confirmed:
            self._bytes -= self._kept.popleft()[3]

    def is_confirmed(self, name: str, fields: Mapping[str, Any]) -> bool:
        """True for an item (or a DATA_LOST) that the broker confirmed while it waited to
        be sent: nothing to send."""
        if name in INDEXED:
            return bool(fields["index"] <= self.confirmed)
        return name == "DATA_LOST" and bool(fields["last"] <= self.confirmed)

    def take_resend(self, task: Any) -> List[Tuple[str, Any, Any]]:
        """The broker may lack what was sent and not confirmed: the messages to send again,
        as the outbox holds them (``(name, fields, task)``, ``task`` the attempt's): a
        DATA_LOST first for what was let go of, then every item kept, in index order. The
        buffer is then empty; the items come back as they are sent again."""
        out: List[Tuple[str, Any, Any]] = []
        if self._dropped_upto > self.confirmed:
            out.append(("DATA_LOST", {"task_id": task.id, "attempt": task.attempt,
                                      "first": self.confirmed + 1, "last": self._dropped_upto},
                        task))
        out.extend((name, fields, task) for _, name, fields, _ in self._kept)
        self.clear()
        return out

    def clear(self) -> None:
        """Forgets everything kept (the attempt ended)."""
        self._kept.clear()
        self._bytes = 0
