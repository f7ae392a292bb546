"""A name -> class registry (as DI-engine's registry factory) and a per-process singleton
metaclass (as DI-engine's SingletonMetaclass)."""

import threading


class Registry(dict):
    """Maps names to classes. ``register(name)`` is a decorator; registering a taken name
    raises unless ``force_overwrite``. ``get(name)`` raises KeyError for an unknown name."""

    def register(self, name=None, module=None, force_overwrite=False):
        def add(cls):
            key = name or cls.__name__
            if key in self and not force_overwrite:
                raise KeyError(f"{key} is already registered: {self[key]}")
            self[key] = cls
            return cls

        return add(module) if module is not None else add

    def get(self, name):
        if name not in self:
            raise KeyError(f"{name} is not registered; known: {sorted(self)}")
        return self[name]


class SingletonMetaclass(type):
    """One instance per class and process; later calls return it and ignore their arguments."""

    _lock = threading.RLock()  # a singleton may make another in its __init__

    def __call__(cls, *args, **kwargs):
        with SingletonMetaclass._lock:
            if "_instance" not in cls.__dict__:
                cls._instance = super().__call__(*args, **kwargs)
        return cls._instance


MQ_REGISTRY = Registry()
