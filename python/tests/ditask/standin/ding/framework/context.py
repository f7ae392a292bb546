"""A step's context: an attribute dict with a step counter; ``renew()`` starts the next step
and carries over the keys named in ``keep``."""


class Context(dict):
    keep = ("train_iter", "env_step", "env_episode")

    def __init__(self, total_step=0, **kwargs):
        super().__init__(total_step=total_step, **kwargs)

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value

    def renew(self):
        kept = {k: self[k] for k in self.keep if k in self}
        return Context(self.total_step + 1, **kept)
