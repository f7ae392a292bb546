from .mq import MQ
from ...utils import MQ_REGISTRY

__all__ = ["MQ", "MQ_REGISTRY"]
