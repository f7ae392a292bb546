"""Stand-in for the parts of DI-engine's `ding` that drive a message queue in its distributed
("ditask") mode: ding.framework's Parallel router, Task layer, EventLoop, the MQ interface and
its registry, and the Barrier / ContextExchanger / ModelExchanger middleware.

Written for rlbus's tests from a description of DI-engine's behaviour, not copied from it.
It mirrors DI-engine 0.5 where rlbus depends on its shapes: the dataclass ``Context`` (fields
as attributes, no dict methods), ``ContextExchanger`` reading the context's fields and setting
attributes, ``Parallel._handle_message`` dropping events nobody registered with ``task.on``,
and the runner's arguments. It
keeps what an MQ implementation sees (which calls arrive, from which thread, with which
payloads, in which order relative to start-up and shutdown) and drops everything else. Kept
apart from the legacy-mode stand-in used by the compat tests: both are named `ding`, so the
two suites run in separate pytest sessions.
"""
