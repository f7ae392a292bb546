"""The interface Parallel drives. Every method is called in a known place:

- ``__init__(**kwargs)`` in the worker process before the listener thread exists; it gets the
  args parser's keyword arguments (unknown ones must be ignored) and must not block;
- ``listen()`` once, first thing in the ``mq_listener`` thread;
- ``recv()`` only from that thread, in a loop; a falsy return ends the loop;
- ``publish(topic, data)`` from any thread, concurrently, possibly before ``listen()`` ran;
- ``subscribe(topic)`` / ``unsubscribe(pattern)`` from user threads while ``recv()`` blocks;
  ``unsubscribe`` gets fnmatch globs (``"task.*"``), ``subscribe`` may repeat a topic;
- ``stop()`` from the main thread while ``recv()`` may block; idempotent.

An MQ may expose ``attach_to`` (a list): Parallel.get_attch_to_len() reports its length.
"""

from typing import Optional, Tuple


class MQ:

    def __init__(self, **kwargs) -> None:
        pass

    def listen(self) -> None:
        raise NotImplementedError

    def publish(self, topic: str, data: bytes) -> None:
        raise NotImplementedError

    def subscribe(self, topic: str) -> None:
        raise NotImplementedError

    def unsubscribe(self, topic: str) -> None:
        raise NotImplementedError

    def recv(self) -> Optional[Tuple[str, bytes]]:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError
