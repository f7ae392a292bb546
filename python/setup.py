"""Build script: packages python/rlbus and copies ../protocol/messages.json and ../VERSION
into it, so an installed package finds its protocol tables and knows its version without the
source tree. The version is the VERSION file's, as the C++ build's."""

import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
MESSAGES = os.path.join(HERE, "..", "protocol", "messages.json")
VERSION = os.path.join(HERE, "..", "VERSION")


def version() -> str:
    with open(VERSION) as f:
        return f.read().strip()


class BuildWithMessages(build_py):
    """build_py that also places messages.json and VERSION inside the built rlbus package."""

    def run(self) -> None:
        super().run()
        for source in (MESSAGES, VERSION):
            if not os.path.isfile(source):
                raise FileNotFoundError(f"not found: {source}")
            target = os.path.join(self.build_lib, "rlbus", os.path.basename(source))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(source, target)


setup(
    version=version(),
    packages=find_packages(include=["rlbus", "rlbus.*"]),
    package_data={"rlbus": ["py.typed"]},  # the package ships its type hints (PEP 561)
    cmdclass={"build_py": BuildWithMessages},
)
