from .barrier import Barrier, BarrierRuntime
from .distributer import ContextExchanger, ModelExchanger

__all__ = ["Barrier", "BarrierRuntime", "ContextExchanger", "ModelExchanger"]
