"""The cart-pole example (examples/ditask_cartpole.py at the top of the tree) in its small form: a learner, an
evaluator and one collector, three spawned processes over a broker the runner starts for
itself, trained until the evaluator's greedy return reaches cart-pole's solved value (195)."""

import json
import os
import subprocess
import sys

import pytest

from . import STANDIN

pytest.importorskip("torch", reason="the example needs PyTorch (apt-get install python3-torch)")

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..")
EXAMPLE = os.path.join(PACKAGE, "..", "examples", "ditask_cartpole.py")


def _run(args, tmp_path, timeout):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STANDIN, os.path.abspath(PACKAGE)]),
               DITASK_WORKER_TIMEOUT=str(timeout))
    env.pop("RLBUS_ENDPOINT", None)  # the example's own default: a broker for the run
    return subprocess.run([sys.executable, EXAMPLE, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout + 30)


def test_cartpole_is_solved_by_a_learner_an_evaluator_and_a_collector_over_the_bus(tmp_path):
    out = tmp_path / "result.json"
    # Solved runs take 700-2 300 collector steps (seed 0: ~1 300); the cap only ends a run
    # that went wrong, so that it fails with its figures instead of running on.
    proc = _run(["--collectors", "1", "--eval-episodes", "5", "--max-env-steps", "8000",
                 "--out", str(out)], tmp_path, timeout=240)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out.exists(), f"no result (exit {proc.returncode}):\n{log}"
    result = json.loads(out.read_text())
    assert result["solved"], f"not solved: {result}\n{log}"
    assert result["eval_return"] >= 195.0
    assert result["train_iter"] > 0 and result["env_step"] > 0  # both kinds of context arrived
    assert proc.returncode == 0, log
    assert "eval return" in proc.stderr  # the evaluator's progress lines


def test_cartpole_refuses_a_run_without_collectors(tmp_path):
    proc = _run(["--collectors", "0"], tmp_path, timeout=30)
    assert proc.returncode == 2
    assert "--collectors must be at least 1" in proc.stderr
