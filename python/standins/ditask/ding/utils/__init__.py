"""Where DI-engine re-exports its registries and small helpers."""

from .registry import MQ_REGISTRY, Registry, SingletonMetaclass

__all__ = ["MQ_REGISTRY", "Registry", "SingletonMetaclass"]
