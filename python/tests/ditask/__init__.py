"""DI-engine's distributed ("ditask") mode over a message queue, with a stand-in `ding` package
(standin/) and the MQ types the tests run over. Importing this package registers them; the
spawned workers import it too (their main functions live in its test modules)."""

import os
import sys

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)

import rlbus.compat  # noqa: E402

from . import redis_mq, zmq_mq  # noqa: E402  (registers "redis" and "zmqpubsub")

# What a DI-engine user does: "rlbus" becomes an mq_type (the spawned workers import this
# package, so they are patched too).
rlbus.compat.patch_dingengine()

__all__ = ["redis_mq", "zmq_mq"]
