"""The package installs with pip (Debian's) and works from the installed copy alone: its
protocol tables and its version travel inside it, and every module imports away from the source
tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import PROTOCOL_DIR, PYTHON_DIR


def test_pip_installs_a_package_that_works_without_the_source_tree(tmp_path) -> None:
    if subprocess.run([sys.executable, "-m", "pip", "--version"],
                      capture_output=True).returncode != 0:
        pytest.skip("pip is not installed (apt-get install python3-pip python3-wheel)")
    # pip builds in the tree it is given: a copy, so the checkout stays clean
    src = tmp_path / "src"
    shutil.copytree(PYTHON_DIR, src / "python",
                    ignore=shutil.ignore_patterns("tests", "peer", "__pycache__", "build",
                                                  "*.egg-info"))
    (src / "protocol").mkdir()
    shutil.copy(os.path.join(PROTOCOL_DIR, "messages.json"), src / "protocol")
    shutil.copy(os.path.join(os.path.dirname(PROTOCOL_DIR), "VERSION"), src)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--no-index", "--target", str(target),
                        str(src / "python")], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1",
                                PIP_ROOT_USER_ACTION="ignore"))
    assert r.returncode == 0, r.stderr[-2000:]
    pkg = target / "rlbus"
    assert (pkg / "messages.json").is_file() and (pkg / "py.typed").is_file()
    code = ("import rlbus, rlbus.protocol as P, rlbus.compat as C; "
            "print(rlbus.__file__, rlbus.__version__); print(P.messages_json_path()); "
            "print(len(P.MESSAGES), C.patch_dingengine())")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RLBUS_MESSAGES_JSON")}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, tables, counts = out.stdout.splitlines()
    where, version = first.split()
    assert where.startswith(str(pkg)) and tables == str(pkg / "messages.json")
    with open(os.path.join(os.path.dirname(PROTOCOL_DIR), "VERSION")) as f:
        assert version == f.read().strip()
    assert (target / f"rlbus-{version}.dist-info").is_dir()  # pip's record has it too
    n, patched = counts.split()
    assert int(n) > 30 and patched == "False"  # no DI-engine here: the patch does nothing
