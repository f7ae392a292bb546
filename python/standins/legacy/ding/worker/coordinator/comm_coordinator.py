"""HTTP CommCoordinator stand-in: refuses to start (the compat one must replace it)."""


class CommCoordinator:
    HTTP = True

    def __init__(self, cfg, callback_fn, logger):
        self._cfg = cfg

    def start(self):
        raise RuntimeError("HTTP CommCoordinator stand-in: patch_dingengine() was not applied")

    def close(self):
        pass
