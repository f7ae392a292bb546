"""A Redis MQ in the shape of DI-engine's RedisMQ, for the benchmark beside the others.

One PUBLISH per message on channel = topic, data = the node's random 32-hex-digit id + "::" +
payload; a node drops messages carrying its own id (and malformed ones). One PubSub
connection, subscribed on demand and polled with get_message() and a 1 ms sleep when idle.
Its known limits are kept on purpose: Redis pub/sub delivers only to current subscribers (a
message published before the SUBSCRIBE arrives is lost), a subscriber whose output buffer
passes the server's pubsub limit is disconnected, ``unsubscribe`` takes channel names
literally (a glob unsubscribes nothing), ``publish`` before ``listen()`` raises
AttributeError, and ``recv`` raises RuntimeError once stopped.
"""

import logging
import time
import uuid

from ding.framework.message_queue import MQ
from ding.utils import MQ_REGISTRY


@MQ_REGISTRY.register("redis")
class RedisMQ(MQ):

    def __init__(self, redis_host, redis_port, **kwargs):
        self.host = redis_host
        self.port = int(redis_port)
        self._id = uuid.uuid4().hex.encode()
        # Imported here, not in listen(): an import in the listener thread gives the GIL away,
        # and main's first subscribe would then find no PubSub yet (upstream imports redis at
        # module level; this package imports this module in every worker, redis or not).
        import redis  # python3-redis
        self._redis = redis
        self._running = False
        self._client = None
        self._pubsub = None

    def listen(self):
        self._client = self._redis.Redis(host=self.host, port=self.port, db=0)
        self._pubsub = self._client.pubsub()
        self._running = True

    def publish(self, topic, data):
        self._client.publish(topic, self._id + b"::" + data)

    def subscribe(self, topic):
        self._pubsub.subscribe(topic)

    def unsubscribe(self, topic):
        self._pubsub.unsubscribe(topic)

    def recv(self):
        while True:
            if not self._running:
                raise RuntimeError("Redis MQ was not running!")
            try:
                msg = self._pubsub.get_message()
                if msg is None:
                    time.sleep(0.001)
                    continue
                if msg.get("type") != "message":
                    continue  # (un)subscribe confirmations
                sender, sep, payload = msg["data"].partition(b"::")
                if not sep or sender == self._id:
                    continue
                return msg["channel"].decode(), payload
            except Exception as e:
                logging.error("redis recv: %s", e)
                time.sleep(0.001)

    def stop(self):
        if not self._running:
            return
        self._running = False
        try:
            self._pubsub.close()
            self._client.close()
        except Exception:
            pass
