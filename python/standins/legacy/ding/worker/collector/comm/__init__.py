from .utils import NaiveCollector

__all__ = ["NaiveCollector"]
