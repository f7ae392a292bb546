"""Build script: packages python/rlbus and copies ../protocol/messages.json into it, so an
installed package finds its protocol tables without the source tree."""

import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
MESSAGES = os.path.join(HERE, "..", "protocol", "messages.json")


class BuildWithMessages(build_py):
    """build_py that also places messages.json inside the built rlbus package."""

    def run(self) -> None:
        super().run()
        if not os.path.isfile(MESSAGES):
            raise FileNotFoundError(f"protocol tables not found: {MESSAGES}")
        target = os.path.join(self.build_lib, "rlbus", "messages.json")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(MESSAGES, target)


setup(
    packages=find_packages(include=["rlbus", "rlbus.*"]),
    package_data={"rlbus": ["py.typed"]},  # the package ships its type hints (PEP 561)
    cmdclass={"build_py": BuildWithMessages},
)
