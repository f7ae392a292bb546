"""The codec's low-level msgpack layer: canonical packing, decoding under the limits of
SPEC §5.1, and opaque values kept as their bytes.

- :class:`Raw`: one complete msgpack value as its exact bytes (opaque user data), decoded on
  demand; :data:`NIL` and :data:`EMPTY_MAP`.
- :func:`pack_value` (canonical msgpack), :func:`unpack_value` (one value under the limits),
  :func:`user_map` (a user's map as bytes the broker will accept), :func:`nesting`.
- The readers the message model decodes bodies with: a body's top-level entries with the
  offsets of their values (:func:`read_map`), maps with keys Python cannot hash kept as
  their pairs (:class:`Pairs`), per-thread packers and unpackers, map headers and counts.

It knows nothing of messages.json: :mod:`rlbus.protocol` loads it and hands this layer its
decoding limits and the error to raise (:func:`configure`) before anything is decoded; what
breaks a limit raises that error (:class:`rlbus.protocol.ProtocolError`) with code 401.
"""

from __future__ import annotations

import struct
import threading
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Tuple, Type, cast

import msgpack

# Set by configure() from messages.json's "limits".
_MAX_ARRAY = _MAX_MAP = _MAX_STR = _MAX_BIN = _MAX_EXT = _MAX_DEPTH = 0
_Error: Type[Exception] = ValueError


def configure(limits: Mapping[str, int], error: type) -> None:
    """Sets the decoding limits (messages.json's ``limits``) and the exception raised for
    what breaks them (called as ``error(401, reason)``)."""
    global _MAX_ARRAY, _MAX_MAP, _MAX_STR, _MAX_BIN, _MAX_EXT, _MAX_DEPTH, _Error
    _MAX_ARRAY = int(limits["max_array"])
    _MAX_MAP = int(limits["max_map"])
    _MAX_STR = int(limits["max_str"])
    _MAX_BIN = int(limits["max_bin"])
    _MAX_EXT = int(limits.get("max_ext", 0))
    _MAX_DEPTH = int(limits["max_depth"])
    _Error = error


class Raw(bytes):
    """One complete msgpack value kept as its exact bytes (opaque user data, SPEC §12.2.3).

    Passing a Raw to :func:`encode` writes these bytes unchanged; :meth:`value` decodes them
    (the decoded value is cached when the codec already decoded it while checking limits).
    """

    def value(self) -> Any:
        """The decoded value (maps as dicts, arrays as lists, str as str, bin as bytes)."""
        cached = self.__dict__.get("_v", _MISSING)
        if cached is _MISSING:
            cached = unpack_value(bytes(self))
            self.__dict__["_v"] = cached
        return cached

    @classmethod
    def of(cls, value: Any) -> "Raw":
        """The canonical msgpack encoding of ``value``, as a Raw."""
        raw = cls(pack_value(value))
        raw.__dict__["_v"] = value
        return raw

    def __repr__(self) -> str:  # pragma: no cover - diagnostics only
        return f"Raw({bytes(self)!r})"


_MISSING = object()
NIL = Raw(b"\xc0")
EMPTY_MAP = Raw(b"\x80")


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError("ext values are not allowed")


def pack_value(value: Any) -> bytes:
    """Canonical msgpack of a value: shortest ints, str as str, bytes as bin, floats as
    float64. A :class:`Raw` is written as its bytes (nested Raw values too)."""
    if isinstance(value, Raw):
        return bytes(value)
    return cast(bytes, packer().pack(value))


def _raw_default(obj: Any) -> Any:
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot encode a {type(obj).__name__} as msgpack")


_local = threading.local()


def packer() -> msgpack.Packer:
    p = getattr(_local, "packer", None)
    if p is None:
        # surrogateescape: a str decoded from bytes that are not UTF-8 (kept as surrogates)
        # is written back as those bytes, as the C++ codec does
        p = msgpack.Packer(use_bin_type=True, default=_raw_default, autoreset=True,
                           unicode_errors="surrogateescape")
        _local.packer = p
    return p


def _unpacker(size: int = 0) -> msgpack.Unpacker:
    # the buffer must hold the whole input: a body is bounded by max-message, not by 1 MiB
    return msgpack.Unpacker(
        raw=False, strict_map_key=False, unicode_errors="surrogateescape", use_list=True,
        max_str_len=_MAX_STR, max_bin_len=_MAX_BIN, max_array_len=_MAX_ARRAY,
        max_map_len=_MAX_MAP, max_ext_len=_MAX_EXT, ext_hook=_reject_ext,
        max_buffer_size=max(1 << 20, size))


if TYPE_CHECKING:  # a list of pairs to the type checker, a plain list subclass at run time
    _PairList = List[Tuple[Any, Any]]
else:
    _PairList = list


class Pairs(_PairList):
    """A map decoded as its (key, value) pairs: keys that Python cannot hash, kept."""


def _too_deep(v: Any, depth: int) -> bool:
    """True when the containers in ``v`` (itself at nesting ``depth``) pass max_depth."""
    stack = [(v, depth)]
    while stack:
        x, d = stack.pop()
        t = type(x)
        if t is dict:
            if d > _MAX_DEPTH:
                return True
            for k, y in x.items():
                tk, ty = type(k), type(y)
                if tk is tuple or tk is list or tk is dict:
                    stack.append((k, d + 1))
                if ty is dict or ty is list or ty is Pairs:
                    stack.append((y, d + 1))
        elif t is list:
            if d > _MAX_DEPTH:
                return True
            for y in x:
                ty = type(y)
                if ty is dict or ty is list or ty is Pairs:
                    stack.append((y, d + 1))
        elif t is tuple:  # an array used as a map key
            if d > _MAX_DEPTH:
                return True
            for y in x:
                if type(y) in (tuple, list, dict, Pairs):
                    stack.append((y, d + 1))
        elif t is Pairs:
            if d > _MAX_DEPTH:
                return True
            for k, y in x:
                for z in (k, y):
                    if type(z) in (tuple, list, dict, Pairs):
                        stack.append((z, d + 1))
    return False


_SCALARS = frozenset((int, float, bool, type(None), str, bytes))


def _flat(d: Mapping[Any, Any]) -> bool:
    """True for a map of scalars only (the common metadata record): two passes in C."""
    return _SCALARS.issuperset(map(type, d.values())) and _SCALARS.issuperset(map(type, d))


def nesting(v: Any) -> int:
    """The levels of maps and arrays in a decoded value, its own included (a scalar is 0,
    an empty map 1)."""
    if type(v) is dict and _flat(v):
        return 1
    deepest = 0
    stack = [(v, 1)]
    while stack:
        x, d = stack.pop()
        t = type(x)
        if t is dict:
            items: Any = x.items()
        elif t is Pairs:
            items = x
        elif t is list or t is tuple:
            items = ((y, None) for y in x)
        else:
            continue
        deepest = max(deepest, d)
        for k, y in items:
            for z in (k, y):
                tz = type(z)
                if tz is dict or tz is list or tz is tuple or tz is Pairs:
                    stack.append((z, d + 1))
    return deepest


def user_map(value: Mapping[Any, Any]) -> Raw:
    """``value`` as one user map field of a message (task_info, meta, info, result): its
    canonical bytes, held to the limits the receiver decodes them under (SPEC §5.1, at the
    depth of a field); ProtocolError 401 saying which otherwise, TypeError or OverflowError
    when it cannot be written as msgpack at all. A map of scalars is checked in place; any
    other is decoded again under the limits."""
    d = dict(value)
    raw = Raw.of(d)
    if len(raw) <= _MAX_STR and len(d) <= _MAX_MAP and _flat(d):
        return raw  # no container inside, and no str or bin longer than the whole
    unpack_value(raw, depth=2)
    return raw


def unpack_value(data: bytes, depth: int = 1) -> Any:
    """Decodes one msgpack value under the SPEC §5.1 limits (ProtocolError 401 otherwise).
    Maps are dicts, except under a map with a key Python cannot hash (a list of pairs).
    ``depth`` is the nesting the value starts at: 1 on its own, 2 as a field of a body
    (the body's map is the first level), so a field may nest one level less."""
    for tolerant in (False, True):
        u = make_unpacker(tolerant, len(data))
        u.feed(data)
        try:
            v = u.unpack()
        except msgpack.OutOfData:
            raise _Error(401, "truncated msgpack value") from None
        except TypeError:
            if tolerant:
                raise _Error(401, "a map key of a kind that cannot be read") from None
            continue
        except (ValueError, msgpack.FormatError, msgpack.StackError) as e:
            raise _Error(401, f"malformed msgpack: {e}") from None
        if u.tell() != len(data):
            raise _Error(401, f"{len(data) - u.tell()} trailing bytes after the value")
        if _too_deep(v, depth):
            raise _Error(401, "msgpack nesting too deep")
        return v
    raise AssertionError("unreachable")


def map_count(raw: bytes) -> int:
    b = raw[0]
    if 0x80 <= b <= 0x8F:
        return b & 0x0F
    if b == 0xDE:
        return int(struct.unpack_from(">H", raw, 1)[0])
    if b == 0xDF:
        return int(struct.unpack_from(">I", raw, 1)[0])
    return -1


def map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    if n < 0x10000:
        return b"\xde" + struct.pack(">H", n)
    return b"\xdf" + struct.pack(">I", n)


def make_unpacker(tolerant: bool, size: int = 0) -> msgpack.Unpacker:
    if not tolerant:
        return _unpacker(size)
    return msgpack.Unpacker(
        raw=False, strict_map_key=False, unicode_errors="surrogateescape", use_list=True,
        max_str_len=_MAX_STR, max_bin_len=_MAX_BIN, max_array_len=_MAX_ARRAY,
        max_map_len=_MAX_MAP, max_ext_len=_MAX_EXT, ext_hook=_reject_ext,
        object_pairs_hook=Pairs, max_buffer_size=max(1 << 20, size))


def _reader(size: int) -> Tuple[msgpack.Unpacker, int]:
    """An unpacker for a body of ``size`` bytes and the offset its tell() starts from: this
    thread's own one, reused, for bodies up to 1 MiB (a fresh one for larger bodies)."""
    if size > 1 << 20:
        return _unpacker(size), 0
    u = getattr(_local, "reader", None)
    if u is None:
        u = _local.reader = _unpacker(size)
    return u, u.tell()


def read_map(body: bytes, tolerant: bool = False) -> List[Tuple[str, Any, int, int]]:
    """The top-level entries of a body: (key, decoded value, value start, value end),
    checked against SPEC §3.4 and §5.1 (ProtocolError 401). Maps nested in values are
    dicts; when one has a key Python cannot hash, the body is read again ``tolerant``ly,
    every nested map then kept as a list of pairs."""
    if not body:
        raise _Error(401, "empty body: expected a msgpack map")
    if tolerant:
        u, base = make_unpacker(True, len(body)), 0
    else:
        u, base = _reader(len(body))
    u.feed(body)
    try:
        out = _read_entries(u, base, body, tolerant)
    except BaseException:
        if not tolerant:
            _local.reader = None  # it may still hold part of this body
        raise
    if out is None:  # a map key Python cannot hash: read it all again, tolerantly
        _local.reader = None
        return read_map(body, True)
    if u.tell() - base != len(body):
        if not tolerant:
            _local.reader = None
        raise _Error(401, f"{len(body) - (u.tell() - base)} trailing bytes after the "
                            f"msgpack body")
    return out


def _read_entries(u: msgpack.Unpacker, base: int, body: bytes,
                  tolerant: bool) -> Optional[List[Tuple[str, Any, int, int]]]:
    """The entries of the map ``u`` holds from ``base`` on; None when a nested map has a
    key Python cannot hash (read it again tolerantly)."""
    try:
        n = u.read_map_header()
    except msgpack.OutOfData:
        raise _Error(401, "truncated msgpack body") from None
    except (ValueError, msgpack.FormatError, msgpack.StackError):
        raise _Error(401, "body is not a msgpack map") from None
    if n > _MAX_MAP:
        raise _Error(401, "msgpack limit exceeded (map size overflow)")
    if 2 * n > len(body) - (u.tell() - base):
        raise _Error(401, "truncated msgpack body")
    out: List[Tuple[str, Any, int, int]] = []
    seen = set()
    unpack, tell = u.unpack, u.tell
    try:
        for _ in range(n):
            key = unpack()
            start = tell() - base
            value = unpack()
            end = tell() - base
            if type(key) is not str:
                raise _Error(401, "map key is not a string")
            if key in seen:
                raise _Error(401, f"duplicate key '{key[:64]}'")
            seen.add(key)
            t = type(value)
            if (t is dict or t is list or t is Pairs) and _too_deep(value, 2):
                raise _Error(401, "msgpack nesting too deep")
            out.append((key, value, start, end))
    except msgpack.OutOfData:
        raise _Error(401, "truncated msgpack body") from None
    except TypeError:
        if tolerant:
            raise _Error(401, "a map key of a kind that cannot be read") from None
        return None
    except _Error:
        raise
    except (ValueError, msgpack.FormatError, msgpack.StackError) as e:
        raise _Error(401, f"malformed msgpack body: {e}") from None
    return out
