from .utils import NaiveCollector  # noqa: F401
