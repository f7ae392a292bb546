"""``python3 -m rlbus``: this package's version, the broker binary it finds, and the broker
endpoint a program that names none would use. Exit status 0, or 1 when no broker binary is
found and none is named (a program would have nowhere to go)."""

import argparse
import os
import sys
from typing import List, Optional

from . import __version__
from ._broker import BROKER_ENV, find_broker
from ._run import DEFAULT_PORT, ENDPOINT_ENV, listening
from .protocol import DEFAULT_ENDPOINT


def main(argv: Optional[List[str]] = None) -> int:
    argparse.ArgumentParser(
        prog="python3 -m rlbus",
        description="Print the rlbus package's version, the rlbus-broker binary it finds ($"
                    f"{BROKER_ENV}, PATH, a build tree beside the source) and the broker "
                    f"endpoint a program would use (${ENDPOINT_ENV}, else its default)."
    ).parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"rlbus {__version__} (python package in {here})")
    try:
        binary = find_broker()
        print(f"broker binary: {binary}")
    except FileNotFoundError as e:
        binary = None
        print(f"broker binary: none: {e}")
    named = os.environ.get(ENDPOINT_ENV)
    if named:
        print(f"endpoint: {named} (${ENDPOINT_ENV})")
    else:
        here_now = "something listens there" if listening(DEFAULT_PORT) else \
            "nothing listens there now"
        print(f"endpoint: {DEFAULT_ENDPOINT} (rlbus.DEFAULT_ENDPOINT) for rlbus.Worker and Bus "
              f"given None, Coordinator given none, and the C++ SDK's options left unset "
              f"(${ENDPOINT_ENV} unset; {here_now}); a DI-engine run (patch_dingengine() "
              f"or a runner with mq_type=\"rlbus\") that names none starts a broker of its "
              f"own, private to this user, that lives as long as the run"
              + ("" if binary else ", which needs a broker binary"))
    return 0 if binary or named else 1


if __name__ == "__main__":
    sys.exit(main())
