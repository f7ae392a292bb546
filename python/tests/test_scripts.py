"""The README's two commands (scripts/run.sh, scripts/test.sh) and the setup they share, run
with stand-ins for apt, dpkg, meson and ninja that record how they were called: the run
command builds only what it runs and shows the build's progress, the test command builds
everything, and each says when something failed with the exit status users expect."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each stand-in appends its arguments to calls.log. ninja prints the progress lines a real
# build prints (and fails when NINJA_FAILS is set); `meson test` exits with MESON_FAILS, and
# lists two tests.
STANDINS = {
    "dpkg-query": 'printf "install ok installed"',
    "apt-get": 'echo "apt-get $*" >> "$CALLS"',
    "sudo": 'exec "$@"',  # for a run as another user than root
    "ninja": '''echo "ninja $*" >> "$CALLS"
echo "ninja: Entering directory 'build'"
echo "[1/2] Compiling C++ object src/a.o"
echo "[2/2] Linking target src/rlbus-broker"
if [ -n "${NINJA_FAILS:-}" ]; then echo "../src/a.cpp:1: error: it broke"; exit 1; fi''',
    "meson": '''echo "meson $*" >> "$CALLS"
case "$1" in
  introspect) echo '[{"name": "tests", "value": true}]' ;;
  setup) mkdir -p "$2" ;;
  test)
    case " $* " in
      *" --list "*) printf 'rlbus:unit / codec\\nrlbus:integration / bench-smoke\\n' ;;
      *) exit "${MESON_FAILS:-0}" ;;
    esac ;;
esac''',
}


def checkout(tmp_path: Path) -> Path:
    """The scripts in a scratch tree whose build/ was configured before, and a PATH of
    stand-ins."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "scripts", tree / "scripts")
    (tree / "build").mkdir()
    (tree / "build" / "build.ninja").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STANDINS.items():
        f = bin_dir / name
        f.write_text("#!/bin/bash\n" + body + "\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    # the demo the run command ends in
    demo = tree / "build" / "examples" / "demo" / "rlbus-demo"
    demo.parent.mkdir(parents=True)
    demo.write_text('#!/bin/bash\necho "demo $*" >> "$CALLS"\n')
    demo.chmod(0o755)
    return tree


def run(tree: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full: Dict[str, str] = dict(os.environ)
    full.update(env)
    full["PATH"] = f"{tree.parent / 'bin'}:/usr/bin:/bin"
    full["CALLS"] = str(tree / "calls.log")
    return subprocess.run(["bash", str(tree / "scripts" / script), *args], env=full,
                          capture_output=True, text=True, timeout=60)


def calls(tree: Path) -> List[str]:
    log = tree / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_run_command_builds_only_what_it_runs_and_shows_progress(tmp_path: Path) -> None:
    tree = checkout(tmp_path)
    r = run(tree, "run.sh", "--episodes", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    ninja = [c for c in calls(tree) if c.startswith("ninja")]
    assert ninja == ["ninja -C build src/rlbus-broker src/rlbus-ctl examples/demo/rlbus-demo"]
    assert "[1/2] Compiling" in r.stdout and "[2/2] Linking" in r.stdout  # progress shown
    assert "building the broker, rlbus-ctl and the demo" in r.stdout
    assert calls(tree)[-1] == "demo run --episodes 3"


def test_the_test_command_builds_everything_and_exits_0_or_1(tmp_path: Path) -> None:
    tree = checkout(tmp_path)
    r = run(tree, "test.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ninja -C build" in calls(tree)  # no targets: everything
    assert any(c.startswith("meson test -C build ") for c in calls(tree))
    # then the C++ tests in the sanitizer builds, the bench's quick run left out
    for sanitized in ("build-sanitize", "build-tsan"):
        assert any(c.startswith(f"meson setup {sanitized} ") for c in calls(tree))
        runs = [c for c in calls(tree) if c.startswith(f"meson test -C {sanitized} ") and
                "--list" not in c]
        assert runs and runs[-1].endswith(" codec"), runs
    r = run(tree, "test.sh", MESON_FAILS="3")  # three tests failed
    assert r.returncode == 1
    assert "the default suites FAILED" in r.stdout


def test_the_quick_test_command_runs_the_fast_suites_only(tmp_path: Path) -> None:
    tree = checkout(tmp_path)
    r = run(tree, "test.sh", "--quick")
    assert r.returncode == 0, r.stdout + r.stderr
    tests = [c for c in calls(tree) if c.startswith("meson test")]
    assert tests == ["meson test -C build --print-errorlogs --suite unit --suite protocol "
                     "--suite python-unit"]


def test_a_failed_build_says_so_with_the_compiler_s_words(tmp_path: Path) -> None:
    tree = checkout(tmp_path)
    r = run(tree, "run.sh", NINJA_FAILS="1")
    assert r.returncode == 1
    assert "it broke" in r.stderr and "the build failed" in r.stderr
    assert not any(c.startswith("demo") for c in calls(tree))
    assert (tree / "build" / "setup.log").read_text().count("error: it broke") == 1


def test_setup_installs_what_is_missing_for_the_mode_it_was_asked(tmp_path: Path) -> None:
    tree = checkout(tmp_path)
    bin_dir = tmp_path / "bin"
    # nothing is installed here
    (bin_dir / "dpkg-query").write_text("#!/bin/bash\nexit 1\n")
    r = run(tree, "setup.sh", "run")
    assert r.returncode == 0, r.stdout + r.stderr
    installs = [c for c in calls(tree) if c.startswith("apt-get") and " install " in c]
    assert installs, r.stdout + r.stderr
    assert "libzmq3-dev" in installs[0] and "catch2" not in installs[0]
    r = run(tree, "setup.sh", "all")
    assert r.returncode == 0, r.stdout + r.stderr
    installs = [c for c in calls(tree) if c.startswith("apt-get") and " install " in c]
    assert "catch2" in installs[-1] and "python3-pytest" in installs[-1]
    assert run(tree, "setup.sh", "nonsense").returncode == 2


def test_the_readme_counts_the_build_steps_the_run_command_takes(tmp_path: Path) -> None:
    """The README says how many build steps the run command's first build takes: it is what
    ninja would run for the targets setup.sh names, in a build configured as setup.sh does."""
    meson, ninja = shutil.which("meson"), shutil.which("ninja")
    if not meson or not ninja:
        pytest.skip("meson and ninja are not installed")
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    line = next(t for t in setup.splitlines() if t.strip().startswith("targets=(") and ")" in t
                and t.strip() != "targets=()")
    targets = line.split("(", 1)[1].split(")", 1)[0].split()
    assert "src/rlbus-broker" in targets
    configure = next(t for t in setup.splitlines() if "meson setup build" in t).split()
    args = [a.replace('"$tests"', "false") for a in configure[configure.index("build") + 1:]
            if a != ">/dev/null"]
    build = tmp_path / "build"
    r = subprocess.run([meson, "setup", str(build), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = subprocess.run([ninja, "-C", str(build), "-t", "commands", *targets],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    readme = (ROOT / "README.md").read_text()
    said = readme.split(" build steps, ", 1)[0].rsplit(" ", 1)[1]
    assert int(said) == len(steps.splitlines()), f"README: {said}; ninja: {len(steps.splitlines())}"
