"""HTTP Slave stand-in: same names and constructor, but it cannot serve."""


class _ActionError(Exception):
    def __init__(self, message=None, data=None):
        Exception.__init__(self, message)
        self.message = message
        self.data = data or {}


class ConnectionRefuse(_ActionError):
    pass


class DisconnectionRefuse(_ActionError):
    pass


class TaskRefuse(_ActionError):
    pass


class TaskFail(Exception):
    def __init__(self, result=None, message=None):
        Exception.__init__(self, message)
        self.result = result or {}
        self.message = message


class Slave:
    HTTP = True

    def __init__(self, host=None, port=None, heartbeat_span=None, request_retries=None,
                 request_retry_waiting=None, channel=None):
        self.host, self.port = host, port

    def start(self):
        raise RuntimeError("HTTP Slave stand-in: rlbus.compat.patch_dingengine() was not applied")

    def _process_task(self, task):
        raise NotImplementedError
