#!/usr/bin/python3
"""The project's lint checks, one per subcommand, each exiting 0 when clean:

  format   every C++ file is laid out as .clang-format says (clang-format --dry-run)
  pyflakes the Python code has no unused import, undefined name or dead assignment
  types    the Python package (python/rlbus) passes mypy in strict mode (python/pyproject.toml)
  tidy     clang-tidy (.clang-tidy's checks) finds nothing in src/ and examples/; needs the build's
           compile_commands.json (argument: the build directory); slow: not in the default suite

Each prints what it found, file by file, and how to fix it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPP_DIRS = ("src", "include", "tests", "bench", "examples")
PY_DIRS = ("python", "bench", "deploy", "protocol", "scripts", "tests", "examples")


def files(dirs, suffixes) -> List[str]:
    out = []
    for d in dirs:
        for base, subdirs, names in os.walk(os.path.join(ROOT, d)):
            subdirs[:] = sorted(s for s in subdirs if not s.startswith((".", "__")))
            out += [os.path.join(base, n) for n in sorted(names) if n.endswith(suffixes)]
    return out


def tool(*names: str) -> str:
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    sys.exit(f"lint: none of {', '.join(names)} is installed (apt-get install {names[0]})")


def check_format() -> int:
    clang_format = tool("clang-format-14", "clang-format")
    bad = []
    for f in files(CPP_DIRS, (".cpp", ".hpp")):
        r = subprocess.run([clang_format, "--dry-run", "-Werror", f], capture_output=True,
                           text=True)
        if r.returncode != 0:
            bad.append(os.path.relpath(f, ROOT))
            print(r.stderr.strip()[:2000])
    if bad:
        print(f"lint format: {len(bad)} file(s) not laid out as .clang-format says; fix with\n"
              f"  clang-format -i " + " ".join(bad))
        return 1
    print("lint format: every C++ file is laid out as .clang-format says")
    return 0


def check_pyflakes() -> int:
    pyflakes = tool("pyflakes3")
    r = subprocess.run([pyflakes] + files(PY_DIRS, (".py",)), capture_output=True, text=True,
                       cwd=ROOT)
    out = (r.stdout + r.stderr).strip()
    if r.returncode != 0:
        print(out.replace(ROOT + os.sep, ""))
        print("lint pyflakes: the findings above need fixing")
        return 1
    print("lint pyflakes: no findings")
    return 0


def check_types() -> int:
    mypy = tool("mypy")
    r = subprocess.run([mypy, "--config-file", os.path.join("python", "pyproject.toml"),
                        os.path.join("python", "rlbus")], capture_output=True, text=True,
                       cwd=ROOT)
    out = (r.stdout + r.stderr).strip()
    if r.returncode != 0:
        print(out)
        print("lint types: the findings above need fixing (mypy --strict, python/pyproject.toml)")
        return 1
    print(f"lint types: {out}")
    return 0


def tidy_units(build_dir: str, sources: List[str]) -> List[str]:
    """What to hand clang-tidy so that it reads every file of `sources` once: in a unity build
    (meson -Dunity=on) the unity files that include them, ten sources to a file, so the standard
    library's and the dependencies' headers are read and matched once for ten sources instead of
    once for each (five times faster); every source no unity file includes goes on its own."""
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    units, covered, wanted = [], set(), set(sources)
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not re.search(r"-unity\d+\.cpp$", path):
            continue
        with open(path) as f:
            included = [os.path.normpath(m) for m in re.findall(r"^#include<(.*)>$", f.read(), re.M)]
        mine = [i for i in included if i in wanted]
        if mine:
            units.append(path)
            covered.update(mine)
    return units + [s for s in sources if s not in covered]


def check_tidy(build_dir: str) -> int:
    clang_tidy = tool("clang-tidy-14", "clang-tidy")
    if not os.path.exists(os.path.join(build_dir, "compile_commands.json")):
        sys.exit(f"lint tidy: {build_dir} has no compile_commands.json (configure it with meson)")
    sources = files(("src", "examples"), (".cpp",))
    units = tidy_units(build_dir, sources)
    # The configuration is named, as a build directory outside the checkout would not find it;
    # a unity file's includes of sources are what it is for, not a suspicious include.
    config = os.path.join(ROOT, ".clang-tidy")

    def one(f: str) -> str:
        r = subprocess.run([clang_tidy, f"--config-file={config}", "-p", build_dir, "--quiet",
                            "--checks=-bugprone-suspicious-include", f],
                           capture_output=True, text=True)
        found = [line for line in r.stdout.splitlines() if ": warning: " in line or
                 ": error: " in line]
        # (a path read through a unity file comes as build/../src/...: said plainly)
        return "\n".join(re.sub(r"^([^:]+)", lambda m: os.path.normpath(m.group(1)), line)
                         for line in found)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        found = [x for x in pool.map(one, units) if x]
    if found:
        text = "\n".join(sorted(set("\n".join(found).splitlines())))
        print(text.replace(ROOT + os.sep, ""))
        print(f"lint tidy: {len(text.splitlines())} finding(s) in src/ and examples/")
        return 1
    print(f"lint tidy: no findings in {len(sources)} files of src/ and examples/ "
          f"({len(units)} translation units)")
    return 0


def main(argv: List[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("format", "pyflakes", "types", "tidy"):
        print(__doc__)
        return 2
    if argv[1] == "format":
        return check_format()
    if argv[1] == "pyflakes":
        return check_pyflakes()
    if argv[1] == "types":
        return check_types()
    if len(argv) != 3:
        sys.exit("usage: lint.py tidy BUILD_DIR")
    return check_tidy(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
