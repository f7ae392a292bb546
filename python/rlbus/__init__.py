"""rlbus: Python client of the rlbus message bus (protocol v1).

This revision ships the protocol codec (:mod:`rlbus.protocol`), driven by
``protocol/messages.json``. The Worker and Coordinator session clients are not part of it
yet.
"""

from . import protocol
from .protocol import ProtocolError

__all__ = ["protocol", "ProtocolError"]
