"""Stand-in for DI-engine's `ding` package, shaped like the parts rlbus.compat replaces.

Only what the compat layer touches exists: ding.interaction's Slave and its exceptions,
the comm test doubles (NaiveCollector, NaiveLearner), and a Coordinator that uses
CommCoordinator the way DI-engine's does. The HTTP classes here refuse to run, so a test
that forgot to patch fails loudly.
"""
