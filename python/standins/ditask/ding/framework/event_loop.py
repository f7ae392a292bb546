"""Named events with listeners. ``emit`` runs the listeners on the loop's own small thread
pool, so delivery is asynchronous and two emits' callbacks may run concurrently or out of
order (as in DI-engine). ``off`` takes fnmatch globs."""

import fnmatch
import logging
import threading
from concurrent.futures import ThreadPoolExecutor


class EventLoop:

    def __init__(self, name="event_loop", n_threads=2):
        self._name = name
        self._n_threads = n_threads
        self._listeners = {}  # event -> [(fn, once)]; a key stays after off()
        self._lock = threading.Lock()
        self._pool = None  # made on first emit, dropped by stop()

    def on(self, event, fn, once=False):
        with self._lock:
            self._listeners.setdefault(event, []).append((fn, once))

    def once(self, event, fn):
        self.on(event, fn, once=True)

    def off(self, event, fn=None):
        with self._lock:
            for name in list(self._listeners):
                if name == event or fnmatch.fnmatchcase(name, event):
                    self._listeners[name] = [l for l in self._listeners[name]
                                             if fn is not None and l[0] is not fn]

    def listened(self, event):
        """True once a listener was registered for ``event``, even if it was removed since."""
        with self._lock:
            return event in self._listeners

    def emit(self, event, *args, **kwargs):
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._n_threads, thread_name_prefix=self._name)
            pool = self._pool
        try:
            pool.submit(self._trigger, event, *args, **kwargs)
        except RuntimeError:  # the loop was stopped meanwhile
            pass

    def _trigger(self, event, *args, **kwargs):
        with self._lock:
            listeners = list(self._listeners.get(event, ()))
            if any(once for _, once in listeners):
                self._listeners[event] = [l for l in self._listeners[event] if not l[1]]
        for fn, _ in listeners:
            try:
                fn(*args, **kwargs)
            except Exception:
                logging.exception("listener of %s raised", event)

    def stop(self):
        """Cancels queued callbacks and waits for running ones; a later emit starts anew."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
