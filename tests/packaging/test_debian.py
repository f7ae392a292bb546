"""rlbus's Debian packages, as a Debian shop would take them: scripts/debs.sh builds them
(dpkg-buildpackage, then lintian with no error); each package holds what it should; unpacked
into a scratch root, the packaged broker serves the packaged Python client.

Slow (a full package build, ~8-15 minutes on 2 cores): not in the default suite. Run it with
`meson test -C build --setup debian --suite debian` (or RLBUS_TEST_DEBIAN=1 and pytest)."""

import glob
import os
import subprocess
import sys

import pytest

SOURCE = os.environ.get("RLBUS_SOURCE_DIR", os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))

if os.environ.get("RLBUS_TEST_DEBIAN") != "1":
    pytest.skip("the package build takes minutes: RLBUS_TEST_DEBIAN=1 runs it",
                allow_module_level=True)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-4000:]}" \
                              f"\n{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run(["bash", os.path.join(SOURCE, "scripts", "debs.sh"), str(out)], timeout=3600)
    found = {os.path.basename(p).split("_")[0]: p for p in glob.glob(str(out / "*.deb"))
             if "-dbgsym_" not in p}  # the debug symbols debhelper splits off
    return {"dir": str(out), "debs": found}


def contents(deb):
    return run(["dpkg-deb", "-c", deb]).stdout


def test_four_packages_are_built_and_lintian_has_no_error(debs):
    assert set(debs["debs"]) == {"rlbus-broker", "librlbus0", "librlbus-dev", "python3-rlbus"}
    with open(os.path.join(debs["dir"], "lintian.txt")) as f:
        assert not [line for line in f if line.startswith("E:")]


def test_each_package_holds_its_part(debs, tmp_path):
    broker = contents(debs["debs"]["rlbus-broker"])
    for path in ("./usr/bin/rlbus-broker", "./usr/bin/rlbus-ctl", "./usr/bin/rlbus-demo",
                 "./etc/rlbus/broker.toml", "/rlbus-broker.service"):
        assert path in broker, path
    lib = contents(debs["debs"]["librlbus0"])
    assert "librlbus.so.0" in lib and "librlbus.a" not in lib
    dev = contents(debs["debs"]["librlbus-dev"])
    for path in ("./usr/include/rlbus/worker.hpp", "librlbus.a", "pkgconfig/rlbus.pc"):
        assert path in dev, path
    assert "server.hpp" not in dev  # only the SDK's headers
    py = contents(debs["debs"]["python3-rlbus"])
    assert "/rlbus/__init__.py" in py and "/rlbus/messages.json" in py
    run(["dpkg-deb", "-x", debs["debs"]["rlbus-broker"], str(tmp_path)])
    units = glob.glob(str(tmp_path / "**" / "rlbus-broker.service"), recursive=True)
    assert len(units) == 1, units
    with open(units[0]) as f:
        assert "ExecStart=/usr/bin/rlbus-broker --config /etc/rlbus/broker.toml" in f.read()
    scripts = run(["dpkg-deb", "-I", debs["debs"]["rlbus-broker"], "postinst"]).stdout
    assert "adduser --system" in scripts and "keygen /etc/rlbus/broker" in scripts


def test_an_upgrade_restarts_a_running_broker_and_a_fresh_install_starts_none(debs):
    """An enabled or running service was stopped by an upgrade and never started again. Now
    postinst restarts it on upgrade (configure with the old version) through
    deb-systemd-invoke, which leaves a disabled, stopped unit alone (so a fresh install
    starts nothing), and no maintainer script stops it for an upgrade."""
    deb = debs["debs"]["rlbus-broker"]
    postinst = run(["dpkg-deb", "-I", deb, "postinst"]).stdout
    assert "_dh_action=restart" in postinst and "_dh_action=start" in postinst, postinst
    assert "deb-systemd-invoke $_dh_action 'rlbus-broker.service'" in postinst, postinst
    # installed disabled: a unit is enabled again only where it was enabled before
    lines = postinst.splitlines()
    for i, line in enumerate(lines):
        if "deb-systemd-helper enable" in line:
            guard = next(g for g in reversed(lines[:i]) if g.lstrip().startswith("if "))
            assert "was-enabled" in guard, guard
    for script in ("prerm", "preinst"):
        lines = subprocess.run(["dpkg-deb", "-I", deb, script], capture_output=True,
                               text=True).stdout.splitlines()
        for i, line in enumerate(lines):
            if "deb-systemd-invoke stop" in line:  # only when the package is removed
                guard = next(g for g in reversed(lines[:i]) if g.lstrip().startswith("if "))
                assert '"$1" = remove' in guard, (script, guard)


def test_the_packaged_broker_serves_the_packaged_python_client(debs, tmp_path):
    root = tmp_path / "root"
    for deb in debs["debs"].values():
        run(["dpkg-deb", "-x", deb, str(root)])
    site = glob.glob(str(root / "usr" / "lib" / "python3*" / "dist-packages"))
    assert site, "python3-rlbus put no package under usr/lib/python3/dist-packages"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLBUS_")}
    env.update(PYTHONPATH=site[0], RLBUS_BROKER=str(root / "usr" / "bin" / "rlbus-broker"))
    program = (
        "import rlbus\n"
        "assert rlbus.__file__.startswith(%r), rlbus.__file__\n"
        "with rlbus.Broker() as b:\n"
        "    a, c = rlbus.Bus(b.router, 'pkg-a'), rlbus.Bus(b.router, 'pkg-c')\n"
        "    assert a.wait_ready(10) and c.wait_ready(10)\n"
        "    c.subscribe('hello')\n"
        "    a.publish('hello', b'from the packages')\n"
        "    print(c.recv(10).payload.decode())\n"
        "    a.close(); c.close()\n" % site[0])
    r = run([sys.executable, "-c", program], env=env, cwd=str(tmp_path), timeout=60)
    assert r.stdout.strip() == "from the packages"
    r = run([sys.executable, "-m", "rlbus"], env=env, cwd=str(tmp_path), timeout=60)
    assert f"broker binary: {root}/usr/bin/rlbus-broker" in r.stdout
