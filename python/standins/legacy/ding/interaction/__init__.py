from .slave import ConnectionRefuse, DisconnectionRefuse, Slave, TaskFail, TaskRefuse

__all__ = ["ConnectionRefuse", "DisconnectionRefuse", "Slave", "TaskFail", "TaskRefuse"]
