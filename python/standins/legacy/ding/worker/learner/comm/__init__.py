from .utils import NaiveLearner

__all__ = ["NaiveLearner"]
