"""patch_dingengine() in fresh interpreters: with the stand-in `ding` package and without
any `ding` at all."""

import os
import subprocess
import sys
import textwrap

from compat_helpers import PYTHON_DIR, STANDIN


def run_python(code, with_ding=True):
    path = [PYTHON_DIR] + ([STANDIN] if with_ding else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_without_ding_patch_does_nothing():
    out = run_python("""
        import sys
        from rlbus.compat import patch_dingengine
        assert patch_dingengine() is False
        assert not any(m == 'ding' or m.startswith('ding.') for m in sys.modules)
        print('ok')
    """, with_ding=False)
    assert "ok" in out


def test_patch_swaps_coordinator_and_slave_before_comm_classes_are_built():
    out = run_python("""
        import rlbus.compat as compat
        assert compat.patch_dingengine() is True
        assert compat.patch_dingengine() is True  # idempotent
        import ding.interaction, ding.interaction.slave
        from ding.worker.coordinator import coordinator, comm_coordinator
        from ding.worker.collector.comm import NaiveCollector
        from ding.worker.learner.comm import NaiveLearner
        assert ding.interaction.Slave is compat.Slave
        assert ding.interaction.slave.Slave is compat.Slave
        assert coordinator.CommCoordinator is compat.CommCoordinator
        assert comm_coordinator.CommCoordinator is compat.CommCoordinator
        assert issubclass(NaiveCollector, compat.Slave) and issubclass(NaiveLearner, compat.Slave)
        # DI-engine's exception classes stay; the compat Slave recognises them by name
        assert ding.interaction.TaskFail is not compat.TaskFail
        c = coordinator.Coordinator({'coordinator': {'broker': 'tcp://127.0.0.1:1'}})
        assert type(c._interaction) is compat.CommCoordinator
        assert c._interaction.endpoint == 'tcp://127.0.0.1:1'
        compat.unpatch_dingengine()
        assert coordinator.CommCoordinator is comm_coordinator.CommCoordinator
        assert getattr(coordinator.CommCoordinator, 'HTTP', False)
        assert getattr(ding.interaction.Slave, 'HTTP', False)
        print('ok')
    """)
    assert "ok" in out


def test_patch_after_comm_classes_were_imported_warns():
    out = run_python("""
        import logging
        logging.basicConfig(level=logging.WARNING)
        import ding.worker  # builds the comm classes on the HTTP Slave
        import rlbus.compat as compat
        assert compat.patch_dingengine() is True
        from ding.worker.collector.comm import NaiveCollector
        assert not issubclass(NaiveCollector, compat.Slave)
        print('ok')
    """)
    assert "ok" in out and "already imported" in out
