from .utils import NaiveLearner  # noqa: F401
