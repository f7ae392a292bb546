# Like DI-engine, importing ding.worker imports the comm classes (built on Slave).
from .collector.comm import NaiveCollector  # noqa: F401
from .learner.comm import NaiveLearner  # noqa: F401
