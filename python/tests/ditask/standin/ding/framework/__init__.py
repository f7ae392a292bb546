from .context import Context
from .event_loop import EventLoop
from .parallel import Parallel
from .task import Role, Task, task

__all__ = ["Context", "EventLoop", "Parallel", "Role", "Task", "task"]
