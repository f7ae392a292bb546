"""CURVE keys for a connection to a broker that has CURVE on.

A key is 32 bytes written as 40 characters of Z85. ``rlbus-broker keygen STEM`` writes a key
pair as two small TOML files: ``STEM.key`` (``public-key`` and ``secret-key``, mode 0600) and
``STEM.pub`` (``public-key`` alone). A peer needs its own ``.key`` and the broker's ``.pub``.
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass
from typing import Any, Dict

import zmq

_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def _valid(key: object) -> bool:
    return isinstance(key, str) and len(key) == 40 and all(c in _Z85 for c in key)


@dataclass(frozen=True)
class CurveKeys:
    """A peer's key pair and the broker's public key, each 40 Z85 characters."""

    public_key: str
    secret_key: str
    server_key: str

    def __post_init__(self) -> None:
        for name in ("public_key", "secret_key", "server_key"):
            if not _valid(getattr(self, name)):
                raise ValueError(f"curve.{name}: expected a CURVE key of 40 Z85 characters")
        if zmq.curve_public(self.secret_key.encode()).decode() != self.public_key:
            raise ValueError("curve.public_key is not the public key of curve.secret_key")

    def apply(self, sock: "zmq.Socket[Any]") -> None:
        """Makes ``sock`` (before it connects) a CURVE client with these keys."""
        sock.curve_serverkey = self.server_key.encode()
        sock.curve_publickey = self.public_key.encode()
        sock.curve_secretkey = self.secret_key.encode()


def read_key_file(path: str) -> Dict[str, str]:
    """The keys in a .key or .pub file; ValueError naming the file and what is wrong."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: {e}") from None
    keys = {}
    for name in ("public-key", "secret-key"):
        if name not in doc:
            continue
        if not _valid(doc[name]):
            raise ValueError(f"{path}: {name} is not a CURVE key (40 Z85 characters)")
        keys[name] = doc[name]
    if "public-key" not in keys:
        raise ValueError(f"{path}: no public-key (a string of 40 Z85 characters)")
    if "secret-key" in keys:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            raise ValueError(f"{path}: holds a secret key but others may read it "
                             f"(mode {mode:o}): chmod 600 {path}")
    return keys


def curve_keys_from_files(key_file: str, broker_key_file: str) -> CurveKeys:
    """Reads a peer's key pair from its .key file and the broker's public key from a .pub
    (or .key) file, as ``rlbus-broker keygen`` writes them."""
    own = read_key_file(key_file)
    if "secret-key" not in own:
        raise ValueError(f"{key_file}: holds no secret-key (a peer needs its .key file, "
                         f"not its .pub)")
    return CurveKeys(own["public-key"], own["secret-key"],
                     read_key_file(broker_key_file)["public-key"])
