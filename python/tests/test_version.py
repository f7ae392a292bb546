"""The version has one home, the VERSION file at the top of the tree: the Python package, the
C++ build (meson's project version, which the broker and rlbus-ctl print) and the Debian
changelog's newest entry all say what it says."""

import json
import os
import re

import pytest

import rlbus

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def version_file() -> str:
    with open(os.path.join(TOP, "VERSION"), encoding="utf-8") as f:
        text = f.read()
    assert re.fullmatch(r"\d+\.\d+\.\d+\n", text), f"VERSION holds {text!r}"
    return text.strip()


def test_the_python_package_reads_the_version_file() -> None:
    assert rlbus.__version__ == version_file()


def test_the_debian_changelog_names_the_same_version() -> None:
    with open(os.path.join(TOP, "debian", "changelog"), encoding="utf-8") as f:
        first = f.readline()
    m = re.match(r"rlbus \(([^)-]+)(-[^)]*)?\) ", first)
    assert m, first
    assert m.group(1) == version_file()


def test_the_cpp_build_has_the_same_version() -> None:
    build = os.environ.get("RLBUS_BUILD_DIR")
    info = os.path.join(build or "", "meson-info", "intro-projectinfo.json")
    if not build or not os.path.isfile(info):
        pytest.skip("no configured build tree (RLBUS_BUILD_DIR)")
    with open(info, encoding="utf-8") as f:
        assert json.load(f)["version"] == version_file()
