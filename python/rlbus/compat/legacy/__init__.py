"""DI-engine's legacy parallel mode (ding.worker, ding.interaction) over the rlbus broker.

- :mod:`.coordinator`: ``CommCoordinator``, the drop-in for DI-engine's HTTP comm coordinator,
  with the operator client of its Kubernetes mode (:mod:`.operator`).
- :mod:`.slave`: ``Slave``, the drop-in for ``ding.interaction.Slave`` that DI-engine's comm
  collector and learner subclass.
- :mod:`.exceptions`: the exceptions of ``ding.interaction`` both of them raise.

``rlbus.compat`` re-exports the classes; ``patch_dingengine()`` installs them into DI-engine.
"""
