"""The rlbus wire protocol, version 1, as a table-driven codec.

Everything this module knows about messages comes from ``protocol/messages.json``, loaded
once at import: the framing header, every message's fields in canonical order with their
types, ranges, length bounds, patterns and enums, the rules that tie fields together, the
decoding limits, the event envelope and the event bodies. A field added to messages.json is
encoded and checked here without a code change.

Where the file is found, first match wins:

1. the path in the environment variable ``RLBUS_MESSAGES_JSON``;
2. ``../../protocol/messages.json`` relative to this file (a source checkout);
3. ``messages.json`` inside this package (copied in by ``setup.py`` at build time).

PUBLISH and DELIVER (``"payload_frame": true``, SPEC §17.1.1) travel as three frames,
``[header][body][payload]``: :func:`encode` gives them the payload frame and :func:`decode`
reads it into :attr:`Message.payload`. An optional field with a ``default`` (the bus's flags
and ``part``) is left out of the body when it holds its default, and reads as it when absent.

Bodies are decoded under the limits of SPEC §5.1 at every nesting level; opaque user data
(``"verbatim": true`` fields: task_info, meta, info, result, data, body) is kept as the exact
bytes received (:class:`Raw`), so it can be forwarded byte for byte, and decoded on demand.
Anything that breaks the framing, body or field rules raises :class:`ProtocolError` carrying
the SPEC §6 code (400, 401, 402, 404, 405) and a reason naming what is wrong.

This module is the message model: messages.json's tables, encoding, decoding and the field
rules. The msgpack underneath (canonical packing, decoding under the limits, :class:`Raw`,
:func:`pack_value`, :func:`unpack_value`, :func:`user_map`, :func:`nesting`) is
:mod:`rlbus._msgpack`; its public names are importable from here as before.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from typing import (TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set,
                    Tuple, cast)

import msgpack

from . import _msgpack
from ._data import data_file
from ._msgpack import EMPTY_MAP, NIL, Raw, nesting, pack_value, unpack_value, user_map
from ._msgpack import Pairs as _Pairs
from ._msgpack import make_unpacker as _make_unpacker
from ._msgpack import map_count as _map_count
from ._msgpack import map_header as _map_header
from ._msgpack import packer as _packer
from ._msgpack import read_map as _read_map

__all__ = [
    "ProtocolError", "Raw", "Message", "Event", "MessageSpec", "FieldSpec", "SPEC", "MESSAGES",
    "BY_ID", "LIMITS", "ERROR_CODES", "VERSION", "DEFAULTS", "DEFAULT_ENDPOINT", "messages_json_path", "header", "parse_header",
    "encode", "encode_body", "check_body", "Encoded", "decode", "decode_body", "decode_event",
    "encode_event",
    "has_message", "has_field", "type_id", "code_name", "unpack_value", "pack_value",
    "user_map", "nesting", "NIL", "EMPTY_MAP",
]


class ProtocolError(ValueError):
    """A message, body or field that breaks protocol v1.

    ``code`` is the SPEC §6 code a broker would answer with (400 frame, 401 body, 402 field,
    404 unknown type, 405 version); ``reason`` says what is wrong, naming the field when
    there is one.
    """

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {code_name(code)}: {reason}")
        self.code = code
        self.reason = reason


def messages_json_path() -> str:
    """Where messages.json is read from (see the module docstring for the order)."""
    env = os.environ.get("RLBUS_MESSAGES_JSON")
    if env:
        return env
    found = data_file(os.path.join("protocol", "messages.json"))
    if found is not None:
        return found
    raise FileNotFoundError(
        "protocol/messages.json not found: set RLBUS_MESSAGES_JSON, run from a source "
        "checkout, or install the package (setup.py copies it in)")


with open(messages_json_path(), "r", encoding="utf-8") as _f:
    SPEC: Dict[str, Any] = json.load(_f)

VERSION: int = int(SPEC["version"])
_HDR = SPEC["header"]
_HEADER_SIZE: int = int(_HDR["size"])
_SIGNATURE: bytes = bytes(_HDR["signature"])
_VERSION_OFFSET: int = int(_HDR["version_offset"])
_TYPE_OFFSET: int = int(_HDR["type_offset"])
LIMITS: Dict[str, int] = {k: int(v) for k, v in SPEC["limits"].items()}
_MAX_ARRAY = LIMITS["max_array"]
_MAX_MAP = LIMITS["max_map"]
_MAX_STR = LIMITS["max_str"]
_MAX_BIN = LIMITS["max_bin"]
ERROR_CODES: Dict[int, str] = {int(e["code"]): str(e["name"]) for e in SPEC["error_codes"]}
# What the SDKs choose where the protocol leaves the choice to a peer (the same numbers the
# C++ SDK reads, from rlbus/defaults.hpp): endpoints, heartbeat, backoff, batch sizes.
DEFAULTS: Dict[str, Any] = dict(SPEC["defaults"])
DEFAULT_ENDPOINT: str = str(DEFAULTS["router_endpoint"])
_msgpack.configure(LIMITS, ProtocolError)
_MISSING = object()


def code_name(code: int) -> str:
    """The SPEC §6 name of a code (``UNKNOWN`` for a code this revision does not know)."""
    return ERROR_CODES.get(code, "UNKNOWN")


# ---- field tables ---------------------------------------------------------------------

_Check = Callable[[Any], Optional[str]]
_PASSED_MAX = 4096  # ids a pattern field remembers as checked


class FieldSpec:
    """One field of a message or event body, as messages.json declares it."""

    __slots__ = ("name", "type", "required", "verbatim", "always_encoded", "key", "check",
                 "rules", "is_resources", "is_bin", "is_items", "default")

    def __init__(self, d: Mapping[str, Any]) -> None:
        self.name: str = str(d["name"])
        self.type: str = str(d["type"])
        self.required: bool = bool(d.get("required", False))
        self.verbatim: bool = bool(d.get("verbatim", False))
        self.always_encoded: bool = bool(d.get("always_encoded", False))
        self.rules: Dict[str, Any] = {k: v for k, v in d.items()
                                      if k not in ("name", "type", "required")}
        self.key: bytes = msgpack.packb(self.name, use_bin_type=True)
        self.is_resources = self.type == "map<str,number>"
        self.is_bin = self.type == "bin"
        self.is_items = self.type == "data-items"
        # the value an absent optional field stands for (_MISSING: none), never written
        self.default: Any = d.get("default", _MISSING)
        self.check: _Check = _make_check(self.name, self.type, d)

    def is_default(self, v: Any) -> bool:
        """True when ``v`` is this field's default (of its very type: 0 is not False)."""
        d = self.default
        return d is not _MISSING and type(v) is type(d) and v == d

    def as_dict(self) -> Dict[str, Any]:
        """The declaration as messages.json has it."""
        out: Dict[str, Any] = {"name": self.name, "type": self.type, "required": self.required}
        out.update(self.rules)
        return out


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogateescape"))


def _make_check(name: str, typ: str, d: Mapping[str, Any]) -> _Check:
    """A function that returns None for a valid decoded value, else why it is not."""
    if typ == "uint":
        lo = int(d.get("min", 0))
        hi = int(d.get("max", 2 ** 64 - 1))

        def check_uint(v: Any) -> Optional[str]:
            if type(v) is not int or v < 0:
                return f"{name} must be an unsigned integer"
            if v < lo or v > hi:
                return f"{name} must be in {lo}..{hi}"
            return None
        return check_uint
    if typ == "bool":
        def check_bool(v: Any) -> Optional[str]:
            return None if type(v) is bool else f"{name} must be a bool"
        return check_bool
    if typ == "str":
        min_len = int(d.get("min_length", 0))
        max_len = int(d.get("max_length", _MAX_STR))
        enum: Optional[FrozenSet[str]] = frozenset(d["enum"]) if "enum" in d else None
        pattern = re.compile(d["pattern"]) if "pattern" in d else None
        if pattern is not None and "\\x21-\\x7e" in pattern.pattern:
            allowed = "printable ASCII other than space (0x21-0x7E)"  # a topic (§17.2.1)
        else:
            allowed = "A-Z a-z 0-9 . _ : @ / -"

        def check_str(v: Any) -> Optional[str]:
            if type(v) is not str:
                return f"{name} must be a str"
            if enum is not None:
                if v not in enum:
                    return f"{name} must be one of {', '.join(sorted(enum))}"
                return None
            if v in passed:  # ids come again and again: each is matched once
                return None
            n = _utf8_len(v)
            if n < min_len or n > max_len:
                return f"{name} must be {min_len}..{max_len} bytes"
            if pattern is not None:
                if pattern.fullmatch(v) is None:
                    return f"{name} has characters outside {allowed}"
                if len(passed) >= _PASSED_MAX:
                    passed.clear()
                passed.add(v)
            return None
        passed: Set[Any] = set()  # values of this field that passed (pattern fields only)
        return check_str
    if typ == "bin":
        max_bin = int(d.get("max_length", _MAX_BIN))

        def check_bin(v: Any) -> Optional[str]:
            if not isinstance(v, (bytes, bytearray, memoryview)) or isinstance(v, Raw):
                return f"{name} must be bin"
            if len(v) > max_bin:
                return f"{name} must be at most {max_bin} bytes"
            return None
        return check_bin
    if typ == "msgpack-map":
        max_nesting = int(d.get("max_nesting", 0))

        def check_map(v: Any) -> Optional[str]:
            # a map with a key Python cannot hash is read as its pairs: still a map
            if not isinstance(v, (dict, _Pairs)):
                return f"{name} must be a map"
            if max_nesting:
                levels = nesting(v)
                if levels > max_nesting:
                    return (f"{name} nests {levels} levels of maps and arrays, more than the "
                            f"{max_nesting} it may have, since the broker relays it deeper inside "
                            f"an event")
            return None
        return check_map
    if typ == "data-items":
        min_items = int(d.get("min_items", 1))
        max_items = int(d.get("max_items", _MAX_ARRAY))
        item_fields = tuple(FieldSpec(f) for f in d.get("item_fields", ()))

        def check_items(v: Any) -> Optional[str]:
            if isinstance(v, Raw):  # as it came: read with every map as its pairs
                u = _make_unpacker(True, len(v))
                u.feed(bytes(v))
                v = u.unpack()
            if not isinstance(v, list) or type(v) is _Pairs:
                return f"{name} must be an array of items"
            if not min_items <= len(v) <= max_items:
                return f"{name} must hold {min_items}..{max_items} items"
            for i, item in enumerate(v):
                if type(item) is _Pairs:  # an item is a body of fields: str keys, no two alike
                    keys = [k for k, _ in item]
                    if not all(type(k) is str for k in keys) or len(set(keys)) != len(keys):
                        return f"{name}: item {i} has a key that is not a str, or one twice"
                    item = dict(item)
                if not isinstance(item, dict):
                    return f"{name}: item {i} is not a map"
                try:
                    _check_fields(f"{name} item {i}", item_fields, item)
                except ProtocolError as e:
                    return e.reason
            return None
        return check_items
    if typ == "msgpack-any":
        return lambda v: None
    if typ == "map<str,number>":
        max_entries = int(d.get("max_entries", _MAX_MAP))
        kmin = int(d.get("key_min_length", 1))
        kmax = int(d.get("key_max_length", 64))
        vmin = float(d.get("value_min", 0))
        finite = bool(d.get("value_finite", True))

        def check_resources(v: Any) -> Optional[str]:
            if not isinstance(v, dict):
                return f"{name} must be a map of str to number"
            if len(v) > max_entries:
                return f"{name} has more than {max_entries} entries"
            for k, x in v.items():
                if type(k) is not str or not kmin <= _utf8_len(k) <= kmax:
                    return f"{name}: names must be str of {kmin}..{kmax} bytes"
                if type(x) is not int and type(x) is not float:
                    return f"{name}: '{k}' must be a number"
                if (finite and not math.isfinite(x)) or x < vmin:
                    return f"{name}: '{k}' must be a non-negative finite number"
            return None
        return check_resources
    raise ValueError(f"messages.json: field {name} has unknown type {typ}")


class MessageSpec:
    """One message of messages.json: its id, name and fields in canonical order."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        self.name: str = str(d["name"])
        self.id: int = int(d["id"])
        self.direction: str = str(d.get("direction", ""))
        self.transport: str = str(d.get("transport", "router"))
        self.payload_frame: bool = bool(d.get("payload_frame", False))  # a third frame
        self.fields: Tuple[FieldSpec, ...] = tuple(FieldSpec(f) for f in d.get("fields", []))
        self.by_name: Dict[str, FieldSpec] = {f.name: f for f in self.fields}
        self.together: Optional[List[Any]] = d.get("together")
        self.exactly_one: Optional[List[str]] = d.get("exactly_one")
        self.header: bytes = header(self.id)
        self.known: FrozenSet[str] = frozenset(self.by_name)


def header(type_id: int) -> bytes:
    """The 4-byte header frame of a message of ``type_id`` (SPEC §3.2)."""
    out = bytearray(_HEADER_SIZE)
    out[0:len(_SIGNATURE)] = _SIGNATURE
    out[_VERSION_OFFSET] = VERSION
    out[_TYPE_OFFSET] = type_id
    return bytes(out)


MESSAGES: Dict[str, MessageSpec] = {}
BY_ID: Dict[int, MessageSpec] = {}
for _m in SPEC["messages"]:
    _spec = MessageSpec(_m)
    MESSAGES[_spec.name] = _spec
    BY_ID[_spec.id] = _spec

_ENVELOPE: Tuple[FieldSpec, ...] = tuple(FieldSpec(f) for f in SPEC.get("event_envelope", []))
_EVENTS_EXACT: Dict[str, Tuple[FieldSpec, ...]] = {}
_EVENTS_PREFIX: List[Tuple[str, Tuple[FieldSpec, ...]]] = []
_EVENTS_SUFFIX: Dict[str, Tuple[FieldSpec, ...]] = {}
for _e in SPEC.get("events", []):
    _fields = tuple(FieldSpec(f) for f in _e.get("fields", []))
    if "topic_prefix" in _e:
        _EVENTS_PREFIX.append((str(_e["topic_prefix"]), _fields))
    else:
        _EVENTS_EXACT[str(_e["topic"])] = _fields
        _suffix = "." + str(_e["topic"]).rsplit(".", 1)[-1]
        _EVENTS_SUFFIX.setdefault(_suffix, _fields)


def has_message(name: str) -> bool:
    """True when messages.json declares a message of this name."""
    return name in MESSAGES


def has_field(message: str, field: str) -> bool:
    """True when messages.json declares ``field`` in ``message``."""
    spec = MESSAGES.get(message)
    return spec is not None and field in spec.by_name


def type_id(name: str) -> int:
    """The type id of a message name; ProtocolError(404) for a name messages.json lacks."""
    spec = MESSAGES.get(name)
    if spec is None:
        raise ProtocolError(404, f"no message named {name}")
    return spec.id


# ---- messages -------------------------------------------------------------------------

class Message:
    """A decoded ROUTER message: its spec name, type id and fields (absent optional fields
    are left out; verbatim fields are :class:`Raw`). ``payload`` is the bytes of the third
    frame of a message that has one (PUBLISH, DELIVER), None for every other."""

    __slots__ = ("name", "type_id", "fields", "payload")

    def __init__(self, name: str, type_id: int, fields: Dict[str, Any],
                 payload: Optional[bytes] = None) -> None:
        self.name = name
        self.type_id = type_id
        self.fields = fields
        self.payload = payload

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A field's value, or ``default`` when the message does not carry it."""
        return self.fields.get(key, default)

    def __repr__(self) -> str:  # pragma: no cover - diagnostics only
        return f"Message({self.name}, {self.fields!r})"


class Event:
    """A decoded PUB event: topic, envelope and body fields together in ``fields``."""

    __slots__ = ("topic", "fields")

    def __init__(self, topic: str, fields: Dict[str, Any]) -> None:
        self.topic = topic
        self.fields = fields

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def parse_header(frame: bytes) -> int:
    """The type id of a header frame; ProtocolError 400 (framing) or 405 (version)."""
    if len(frame) != _HEADER_SIZE or frame[:len(_SIGNATURE)] != _SIGNATURE:
        raise ProtocolError(400, f"header frame must be {_HEADER_SIZE} bytes starting 'RL'")
    if frame[_VERSION_OFFSET] != VERSION:
        raise ProtocolError(405, f"protocol version {frame[_VERSION_OFFSET]} is not {VERSION}")
    return frame[_TYPE_OFFSET]


def _check_fields(spec_name: str, fields: Sequence[FieldSpec], values: Mapping[str, Any],
                  raw_counts: Optional[Dict[str, int]] = None) -> None:
    for f in fields:
        v = values.get(f.name, _MISSING)
        if v is _MISSING:
            if f.required:
                raise ProtocolError(402, f"{spec_name}: {f.name} is missing")
            continue
        if v is None and f.type != "msgpack-any":
            raise ProtocolError(402, f"{spec_name}: {f.name} must not be nil")
        why = f.check(v.value() if f.verbatim and isinstance(v, Raw) and not f.is_items else v)
        if why is not None:
            raise ProtocolError(402, f"{spec_name}: {why}")
        if f.is_resources and raw_counts is not None and raw_counts.get(f.name, -1) != len(v):
            raise ProtocolError(402, f"{spec_name}: {f.name} repeats a name")


def _check_rules(spec: MessageSpec, values: Mapping[str, Any]) -> None:
    if spec.exactly_one:
        present = [n for n in spec.exactly_one if n in values]
        if len(present) != 1:
            raise ProtocolError(
                402, f"{spec.name}: exactly one of {' and '.join(spec.exactly_one)} is required")
    if spec.together:
        singles = [n for n in spec.together if isinstance(n, str)]
        groups = [g for g in spec.together if not isinstance(g, str)]
        names = singles + [n for g in groups for n in g]
        if any(n in values for n in names):
            if not all(n in values for n in singles) or any(
                    sum(1 for n in g if n in values) != 1 for g in groups):
                raise ProtocolError(
                    402, f"{spec.name}: {', '.join(singles)} and one of "
                    f"{' / '.join('|'.join(g) for g in groups)} travel together")


def decode_body(type_id_: int, body: bytes) -> Message:
    """Decodes and checks the body of a message of ``type_id_`` (SPEC §3.4, §5).

    Unknown fields are ignored (§5.4) but still decoded under the limits.
    """
    spec = BY_ID.get(type_id_)
    if spec is None:
        raise ProtocolError(404, f"unknown type id 0x{type_id_:02x}")
    if spec.transport == "pub":
        raise ProtocolError(404, f"{spec.name} travels on the event endpoint, in its own frames")
    body = bytes(body)
    entries = _read_map(body)
    values: Dict[str, Any] = {}
    counts: Optional[Dict[str, int]] = None
    by_name = spec.by_name
    for key, value, start, end in entries:
        f = by_name.get(key)
        if f is None:
            continue
        if f.verbatim:
            raw = Raw(body[start:end])
            if type(value) is not _Pairs:
                raw.__dict__["_v"] = value
            elif f.type == "msgpack-map":
                value = {}
            values[key] = raw
            if f.type == "msgpack-map" and not isinstance(value, (dict, _Pairs)):
                raise ProtocolError(402, f"{spec.name}: {key} must be a map")
            continue
        if f.is_resources:
            if type(value) is _Pairs:  # read tolerantly because of a key elsewhere
                try:
                    value = dict(value)
                except TypeError:
                    pass  # a name Python cannot hash: refused by the resources rule
            if counts is None:
                counts = {}
            counts[key] = _map_count(body[start:end])
        values[key] = value
    _check_fields(spec.name, spec.fields, values, counts)
    _check_rules(spec, values)
    return Message(spec.name, spec.id, values)


def decode(frames: Sequence[bytes]) -> Message:
    """Decodes ``[header, body]``, or ``[header, body, payload]`` for a message with a payload
    frame (PUBLISH, DELIVER), as a ROUTER message (SPEC §3.1-§3.6 order of checks, except
    session state and direction, which are the broker's). Any other count of frames is a
    ProtocolError 400, as is a payload frame on a message without one (§17.1.1)."""
    n = len(frames)
    if n != 2 and n != 3:
        raise ProtocolError(400, f"a message is 2 frames (3 with a payload), not {n}")
    tid = parse_header(bytes(frames[0]))
    spec = BY_ID.get(tid)
    wants = 3 if spec is not None and spec.payload_frame else 2
    if n != wants:
        what = spec.name if spec is not None else f"type 0x{tid:02x}"
        raise ProtocolError(400, f"{what} is {wants} frames, not {n}")
    msg = decode_body(tid, frames[1])
    if n == 3:
        msg.payload = bytes(frames[2])
    return msg


def _encode_value(f: FieldSpec, v: Any, packer: msgpack.Packer) -> bytes:
    if isinstance(v, Raw):
        return bytes(v)
    if f.is_resources:
        return _pack_resources(v, packer)
    if f.type == "bin" and not isinstance(v, bytes):
        v = bytes(v)
    return cast(bytes, packer.pack(v))


def _pack_resources(res: Mapping[str, Any], packer: msgpack.Packer) -> bytes:
    """Resources as SPEC §4.1.4 writes them: sorted names, whole values in [0, 2^53) as
    integers and everything else as float64."""
    items = sorted(res.items(), key=lambda kv: kv[0].encode("utf-8", "surrogateescape"))
    out = [_map_header(len(items))]
    for k, x in items:
        out.append(packer.pack(k))
        if type(x) is int and 0 <= x < 2 ** 53:
            out.append(packer.pack(x))
        elif float(x).is_integer() and 0 <= float(x) < 2.0 ** 53:
            out.append(packer.pack(int(x)))
        else:
            out.append(b"\xcb" + struct.pack(">d", float(x)))
    return b"".join(out)


def _present(name: str, fields: Mapping[str, Any]) -> Tuple["MessageSpec", Dict[str, Any]]:
    spec = MESSAGES.get(name)
    if spec is None:
        raise ProtocolError(404, f"no message named {name}")
    present = {k: v for k, v in fields.items() if v is not None or
               (k in spec.by_name and spec.by_name[k].type == "msgpack-any")}
    for f in spec.fields:
        if f.is_resources and f.always_encoded and f.name not in present:
            present[f.name] = {}
    return spec, present


def _check_present(spec: "MessageSpec", present: Mapping[str, Any]) -> None:
    unknown = [k for k in present if k not in spec.known]
    if unknown:
        raise ProtocolError(402, f"{spec.name}: no field named {unknown[0]}")
    _check_fields(spec.name, spec.fields, present)
    _check_rules(spec, present)


def check_body(name: str, fields: Mapping[str, Any],
               only: Optional[Tuple[str, ...]] = None) -> None:
    """Holds ``fields`` to the rules of message ``name`` as :func:`encode_body` does
    (ProtocolError 402 naming the field), without encoding them. With ``only``, just those
    fields are held to their rules (the caller vouches for the others)."""
    if only is None:
        _check_present(*_present(name, fields))
        return
    key = (name, only)
    subset = _SUBSETS.get(key)
    if subset is None:
        spec = MESSAGES[name]
        subset = _SUBSETS[key] = tuple(spec.by_name[n] for n in only)
    _check_fields(name, subset, {k: v for k, v in fields.items() if v is not None})


_SUBSETS: Dict[Tuple[str, Tuple[str, ...]], Tuple[FieldSpec, ...]] = {}


if TYPE_CHECKING:  # a dict of fields to the type checker, a plain dict subclass at run time
    _Fields = Dict[str, Any]
else:
    _Fields = dict


class Encoded(_Fields):
    """The fields of one message together with its body, checked and encoded once (for a
    message that is built on one thread and sent on another, or sent again): :func:`encode`
    of the same message name writes :attr:`body` without looking at the fields again. The
    fields are for reading; changing them does not change the body."""

    __slots__ = ("name", "body")

    def __init__(self, name: str, fields: Mapping[str, Any], check: bool = True) -> None:
        super().__init__(fields)
        self.body = encode_body(name, fields, check)
        self.name = name


def encode_body(name: str, fields: Mapping[str, Any], check: bool = True) -> bytes:
    """The canonical body of message ``name`` (SPEC §5.5): fields in table order, absent
    optional fields left out (a None value counts as absent), :class:`Raw` values written
    byte for byte, resources sorted. With ``check`` the values are held to the field rules
    first (ProtocolError 402 naming the field)."""
    if type(fields) is Encoded and fields.name == name:
        return fields.body
    if check:
        spec, present = _present(name, fields)
        _check_present(spec, present)
    else:
        found = MESSAGES.get(name)
        if found is None:
            raise ProtocolError(404, f"no message named {name}")
        spec = found
    # the fields to write, in table order; plain: nothing written verbatim or specially (a
    # Raw, resources, a bin that is not bytes), so one msgpack call writes the whole map
    ordered: Dict[str, Any] = {}
    plain = True
    for f in spec.fields:
        v = fields.get(f.name, _MISSING)
        if v is _MISSING or (v is None and f.type != "msgpack-any"):
            if not (f.is_resources and f.always_encoded):
                continue
            v = {}
        elif f.default is not _MISSING and f.is_default(v):
            continue  # a flag at its default is left out (§5.5)
        ordered[f.name] = v
        if plain and (isinstance(v, Raw) or f.is_resources or (f.is_bin and type(v) is not bytes)):
            plain = False
    packer = _packer()
    if plain:
        return cast(bytes, packer.pack(ordered))
    parts = [_map_header(len(ordered))]
    for k, v in ordered.items():
        f = spec.by_name[k]
        parts.append(f.key)
        parts.append(_encode_value(f, v, packer))
    return b"".join(parts)


_BYTES_LIKE = (bytes, bytearray, memoryview)


def encode(name: str, fields: Optional[Mapping[str, Any]] = None, payload: Any = None,
           check: bool = True) -> Tuple[Any, ...]:
    """``(header, body)`` frames of message ``name``; ``(header, body, payload)`` for a
    message with a payload frame (PUBLISH, DELIVER), the payload (bytes-like, handed on as
    given; b"" when None) raw, not msgpack. A payload for any other message is a
    ProtocolError 400: it has no such frame (SPEC §17.1.1)."""
    spec = MESSAGES.get(name)
    if spec is None:
        raise ProtocolError(404, f"no message named {name}")
    body = encode_body(name, fields or {}, check)
    if spec.payload_frame:
        if payload is None:
            payload = b""
        elif not isinstance(payload, _BYTES_LIKE):
            raise TypeError(f"{name}: the payload is bytes, not {type(payload).__name__}")
        return spec.header, body, payload
    if payload is not None:
        raise ProtocolError(400, f"{name} has no payload frame (only PUBLISH and DELIVER do)")
    return spec.header, body


# ---- events ---------------------------------------------------------------------------

def _event_fields(topic: str) -> Tuple[FieldSpec, ...]:
    exact = _EVENTS_EXACT.get(topic)
    if exact is not None:
        return exact
    for prefix, fields in _EVENTS_PREFIX:
        if topic.startswith(prefix):
            return fields
    dot = topic.rfind(".")
    if dot >= 0:
        return _EVENTS_SUFFIX.get(topic[dot:], ())
    return ()


def decode_event(frames: Sequence[bytes]) -> Event:
    """Decodes a PUB event ``[topic, header, body]`` (SPEC §7): the envelope always, the
    topic's own fields when the topic is known; unknown topics keep only the envelope."""
    if len(frames) != 3:
        raise ProtocolError(400, f"an event is 3 frames, not {len(frames)}")
    topic = bytes(frames[0]).decode("utf-8", "surrogateescape")
    tid = parse_header(bytes(frames[1]))
    ev = MESSAGES.get("EVENT")
    if ev is None or tid != ev.id:
        raise ProtocolError(404, f"type 0x{tid:02x} is not EVENT")
    body = bytes(frames[2])
    entries = _read_map(body)
    fields = _ENVELOPE + _event_fields(topic)
    known = {f.name: f for f in fields}
    values: Dict[str, Any] = {}
    counts: Dict[str, int] = {}
    for key, value, start, end in entries:
        f = known.get(key)
        if f is None:
            continue
        if f.verbatim:
            value = Raw(body[start:end])
        if f.is_resources:
            if type(value) is _Pairs:  # read tolerantly because of a key elsewhere
                try:
                    value = dict(value)
                except TypeError:
                    pass
            counts[key] = _map_count(body[start:end])
        values[key] = value
    _check_fields(topic, fields, values, counts)
    return Event(topic, values)


def encode_event(topic: str, fields: Mapping[str, Any]) -> Tuple[bytes, bytes, bytes]:
    """``(topic, header, body)`` frames of an event in canonical form."""
    spec_fields = _ENVELOPE + _event_fields(topic)
    present = {k: v for k, v in fields.items() if v is not None}
    for f in spec_fields:
        if f.is_resources and f.always_encoded and f.name not in present:
            present[f.name] = {}
    _check_fields(topic, spec_fields, present)
    packer = _packer()
    parts = []
    for f in spec_fields:
        if f.name in present:
            parts.append(f.key)
            parts.append(_encode_value(f, present[f.name], packer))
    return (topic.encode("utf-8"), header(MESSAGES["EVENT"].id),
            _map_header(len(parts) // 2) + b"".join(parts))
