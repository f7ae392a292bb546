from .context import Context, OnlineRLContext
from .event_loop import EventLoop
from .parallel import Parallel
from .task import Role, Task, task

__all__ = ["Context", "OnlineRLContext", "EventLoop", "Parallel", "Role", "Task", "task"]
