"""Files the package reads beside its code (messages.json, VERSION): in a source checkout where
the tree keeps them, in an installed package the copies setup.py puts in."""

import os
from typing import Optional

_HERE = os.path.dirname(os.path.abspath(__file__))


def data_file(checkout_path: str) -> Optional[str]:
    """``checkout_path`` (from the top of the tree) when this package sits in a source checkout,
    else the copy of the same name inside the package; None when neither exists."""
    for path in (os.path.normpath(os.path.join(_HERE, "..", "..", checkout_path)),
                 os.path.join(_HERE, os.path.basename(checkout_path))):
        if os.path.isfile(path):
            return path
    return None
