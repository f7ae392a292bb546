"""Stand-in for the parts of DI-engine's `ding` that drive a message queue in its distributed
("ditask") mode: ding.framework's Parallel router, Task layer, EventLoop, the MQ interface and
its registry, and the Barrier / ContextExchanger / ModelExchanger middleware.

Written for rlbus's tests from a description of DI-engine's behaviour, not copied from it. It
keeps what an MQ implementation sees (which calls arrive, from which thread, with which
payloads, in which order relative to start-up and shutdown) and drops everything else. Kept
apart from the legacy-mode stand-in used by the compat tests: both are named `ding`, so the
two suites run in separate pytest sessions.
"""
