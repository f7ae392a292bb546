"""Batched data (SPEC §12.12.5): DATA that wait together in a worker's outbox leave as one
DATA_BATCH.

:func:`batchable` says how many DATA at the front of the outbox may share one batch
(consecutive indexes of one attempt, at most :data:`BATCH_ITEMS` items and
:data:`BATCH_BYTES` bytes of items, each meta shallow enough to travel nested in an event);
:func:`encode_batch` writes their DATA_BATCH, cutting each item from the body its DATA was
encoded with instead of encoding it again.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Tuple

from . import protocol as P

__all__ = ["BATCH_ITEMS", "BATCH_BYTES", "batchable", "encode_batch"]

# A DATA_BATCH carries at most this many items and bytes of items (an item's keys counted at
# _ITEM_OVERHEAD); a meta deeper than _BATCH_NESTING goes alone.
BATCH_ITEMS = 1024
BATCH_BYTES = P.DEFAULTS["data_batch_max_bytes"]
_ITEM_OVERHEAD = 48
_BATCH_NESTING = 12

_TASK_KEY = len(P.pack_value("task_id"))
_ATTEMPT_KEY = len(P.pack_value("attempt"))
_INDEX_KEY = len(P.pack_value("index"))


def _uint_len(v: int) -> int:
    """Bytes of a uint in its smallest msgpack form."""
    return 1 if v < 0x80 else 2 if v < 0x100 else 3 if v < 0x10000 else 5 if v < 2 ** 32 else 9


def _item_of(data: P.Encoded, head: int) -> bytes:
    """The DATA_BATCH item a DATA stands for, cut from the DATA's canonical body: its fields
    but task_id, attempt (the first two, ``head`` bytes with the map's header, the same for
    every DATA of an attempt) and index (the last), under a header of 3 fewer."""
    body = data.body
    tail = _INDEX_KEY + _uint_len(data["index"])
    return bytes((body[0] - 3,)) + body[head:len(body) - tail]


def batchable(outbox: Iterable[Tuple[str, Any, Optional[Any]]], max_message: int) -> int:
    """How many DATA at the front of ``outbox`` (entries ``(name, fields, task)``, the
    fields of a DATA an :class:`~rlbus.protocol.Encoded`) can share one DATA_BATCH:
    consecutive indexes of one task's attempt, within the bounds (and half the broker's
    ``max_message`` when it is known), each meta shallow enough."""
    n = 0
    size = 0
    limit = BATCH_BYTES
    if max_message:
        limit = min(limit, max_message // 2)
    first = None
    for entry in outbox:
        if first is None:
            first = entry
        name, fields, task = entry
        if name != "DATA" or task is not first[2] or n == BATCH_ITEMS \
                or fields["index"] != first[1]["index"] + n:
            break
        size += len(fields.body) + _ITEM_OVERHEAD
        meta = fields["meta"]
        if size > limit or P.nesting(meta.value() if isinstance(meta, P.Raw) else meta) \
                > _BATCH_NESTING:
            break
        n += 1
    return n


def encode_batch(data: Sequence[P.Encoded]) -> P.Encoded:
    """The DATA_BATCH that carries ``data`` (consecutive DATA of one attempt, as
    :func:`batchable` counted them)."""
    first = data[0]
    head = 1 + _TASK_KEY + len(P.pack_value(first["task_id"])) + _ATTEMPT_KEY + \
        _uint_len(first["attempt"])
    items = [_item_of(d, head) for d in data]
    n = len(items)
    header = bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return P.Encoded("DATA_BATCH", {
        "task_id": first["task_id"], "attempt": first["attempt"],
        "first_index": first["index"], "items": P.Raw(header + b"".join(items))},
        check=False)
