from .slave import ConnectionRefuse, DisconnectionRefuse, Slave, TaskFail, TaskRefuse  # noqa: F401
