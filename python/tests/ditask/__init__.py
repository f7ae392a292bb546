"""DI-engine's distributed ("ditask") mode over a message queue, with the stand-in `ding` package
of python/standins/ditask and the MQ types the tests run over (beside it). Importing this
package registers them; the spawned workers import it too (their main functions live in its
test modules)."""

import os
import sys

STANDIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "standins", "ditask")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)

import rlbus.compat  # noqa: E402

import redis_mq  # noqa: E402  (registers "redis")
import zmq_mq  # noqa: E402  (registers "zmqpubsub")

# What a DI-engine user does: "rlbus" becomes an mq_type (the spawned workers import this
# package, so they are patched too).
rlbus.compat.patch_dingengine()

__all__ = ["redis_mq", "zmq_mq"]
