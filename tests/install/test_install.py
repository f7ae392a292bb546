"""rlbus installed as a C++ user takes it: `meson install --destdir` into a scratch root, then
a program of a project of its own (consumer/) built against that install with pkg-config,
linked shared and static, and built again with rlbus as a meson subproject; each build runs
one collector task end to end through the installed broker.

Environment: RLBUS_BUILD_DIR (the configured, built tree), RLBUS_SOURCE_DIR (the checkout),
CXX (default c++)."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

SOURCE = os.environ.get("RLBUS_SOURCE_DIR", os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("RLBUS_BUILD_DIR", os.path.join(SOURCE, "build"))
CONSUMER = os.path.join(SOURCE, "tests", "install", "consumer")
CXX = os.environ.get("CXX", "c++")
PUBLIC_HEADERS = {"bus.hpp", "connection.hpp", "coordinator.hpp", "defaults.hpp", "role.hpp",
                  "types.hpp", "worker.hpp"}

sys.path.insert(0, os.path.join(SOURCE, "python"))
from rlbus import Broker  # noqa: E402


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}" \
                              f"\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The install tree: DESTDIR/<prefix>, as `meson install --destdir` lays it out."""
    destdir = tmp_path_factory.mktemp("destdir")
    run(["meson", "install", "-C", BUILD, "--no-rebuild", "--quiet", "--destdir", str(destdir)])
    options = json.loads(run(["meson", "introspect", "--buildoptions", BUILD]).stdout)
    opts = {o["name"]: o["value"] for o in options}
    tree = str(destdir) + opts["prefix"]
    libdir = os.path.join(tree, opts["libdir"])
    return {"destdir": str(destdir), "tree": tree, "libdir": libdir,
            "bin": os.path.join(tree, opts["bindir"]),
            "include": os.path.join(tree, opts["includedir"])}


def pkg_config(root, *args):
    # rlbus.pc names its prefix; the scratch root's is given instead (rlbus.pc requires no
    # other package's .pc, so no other prefix is touched)
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(root["libdir"], "pkgconfig"))
    return run(["pkg-config", f"--define-variable=prefix={root['tree']}", *args, "rlbus"],
               env=env).stdout.split()


def collect_once(program, broker, env=None):
    r = run([program, broker.router], timeout=60, env=env)
    assert "task finished: 3 data items" in r.stdout


@pytest.fixture(scope="module")
def broker(root):
    """The installed broker binary, on free loopback ports."""
    with Broker(binary=os.path.join(root["bin"], "rlbus-broker")) as b:
        yield b


def test_the_install_holds_the_binaries_the_public_headers_and_the_library(root):
    for name in ("rlbus-broker", "rlbus-ctl", "rlbus-demo"):
        assert os.access(os.path.join(root["bin"], name), os.X_OK), name
    headers = set(os.listdir(os.path.join(root["include"], "rlbus")))
    assert headers == PUBLIC_HEADERS  # the broker's internals stay out
    assert os.path.exists(os.path.join(root["libdir"], "librlbus.a"))
    shared = glob.glob(os.path.join(root["libdir"], "librlbus.so.*.*"))
    assert len(shared) == 1, shared
    soname = run(["readelf", "-d", shared[0]]).stdout
    assert "Library soname: [librlbus.so.0]" in soname
    assert os.path.islink(os.path.join(root["libdir"], "librlbus.so"))
    project = json.loads(run(["meson", "introspect", "--projectinfo", BUILD]).stdout)
    assert pkg_config(root, "--modversion") == [project["version"]]


def test_a_program_built_with_pkg_config_runs_a_task_through_the_installed_broker(
        root, broker, tmp_path):
    program = str(tmp_path / "collect-once")
    run([CXX, "-std=c++17", os.path.join(CONSUMER, "collect_once.cpp"), "-o", program,
         *pkg_config(root, "--cflags", "--libs")])
    needed = run(["readelf", "-d", program]).stdout
    assert "Shared library: [librlbus.so.0]" in needed
    collect_once(program, broker, env=dict(os.environ, LD_LIBRARY_PATH=root["libdir"]))


def test_a_program_linked_statically_needs_no_librlbus_at_run_time(root, broker, tmp_path):
    program = str(tmp_path / "collect-once-static")
    flags = [os.path.join(root["libdir"], "librlbus.a") if f == "-lrlbus" else f
             for f in pkg_config(root, "--static", "--cflags", "--libs")]
    run([CXX, "-std=c++17", os.path.join(CONSUMER, "collect_once.cpp"), "-o", program, *flags])
    assert "librlbus" not in run(["readelf", "-d", program]).stdout
    collect_once(program, broker)


def test_a_meson_project_builds_it_as_a_subproject(broker, tmp_path):
    project = tmp_path / "consumer"
    shutil.copytree(CONSUMER, project)
    (project / "subprojects").mkdir()
    os.symlink(SOURCE, project / "subprojects" / "rlbus")
    build = str(project / "build")
    # forcefallback: the subproject even where an rlbus is installed on this machine
    run(["meson", "setup", build, str(project), "--wrap-mode=forcefallback"])
    run(["ninja", "-C", build], timeout=1200)
    assert not os.path.exists(os.path.join(build, "subprojects", "rlbus", "src",
                                           "rlbus-broker"))  # only the SDK was built
    collect_once(os.path.join(build, "collect-once"), broker)
