# Like DI-engine, importing ding.worker imports the comm classes (built on Slave).
from .collector.comm import NaiveCollector
from .learner.comm import NaiveLearner

__all__ = ["NaiveCollector", "NaiveLearner"]
