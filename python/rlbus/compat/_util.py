"""Small helpers shared by the DI-engine compatibility layer.

They turn DI-engine's loosely typed values into what the rlbus wire accepts: JSON-like
user data (DI-engine's HTTP transport spoke JSON, so its dicts are JSON-clean but may be
EasyDicts, tuples or numpy scalars), peer and task ids that obey the id rule, numeric
resources, and the broker endpoint from config or environment (or the broker of a run on one
machine that names none, see rlbus._run).
"""

import importlib
import logging
import math
import os
import re
from typing import Any, Dict, Optional

from .._run import ENDPOINT_ENV as ENDPOINT_ENV
from ..protocol import DEFAULT_ENDPOINT as DEFAULT_ENDPOINT
WORKER_ID_ENV = "RLBUS_WORKER_ID"
COORDINATOR_ID_ENV = "RLBUS_COORDINATOR_ID"  # a stable coordinator id, to adopt a run's tasks
CURVE_KEY_ENV = "RLBUS_CURVE_KEY"    # this process's .key file, for a broker with CURVE on
BROKER_KEY_ENV = "RLBUS_BROKER_KEY"  # the broker's .pub file
RUN_LOCK_ENV = "RLBUS_RUN_LOCK"  # set for the processes of a run that started its own broker

_ID_RE = re.compile(r"^[A-Za-z0-9._:@/-]{1,128}$")
_ID_BAD_CHAR = re.compile(r"[^A-Za-z0-9._:@/-]")

log = logging.getLogger("rlbus.compat")

# The SDK module, looked up lazily so that unit tests can put a stand-in in its place.
_sdk_override: Any = None


def sdk() -> Any:
    """The `rlbus` SDK module (or the stand-in installed with set_sdk)."""
    if _sdk_override is not None:
        return _sdk_override
    return importlib.import_module("rlbus")


def set_sdk(module: Any) -> None:
    """Use `module` instead of the real SDK (tests); None restores the real one."""
    global _sdk_override
    _sdk_override = module


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def cfg_get(cfg: Any, *keys: str, default: Any = None) -> Any:
    """First present, non-None value among `keys` of a dict/EasyDict/object config."""
    for key in keys:
        value = _cfg_get(cfg, key)
        if value is not None:
            return value
    return default


def resolve_endpoint(cfg: Any = None, explicit: Any = None) -> str:
    """The broker's ROUTER endpoint: an explicit argument, then the config's `broker`
    (or `rlbus.endpoint`), then $RLBUS_ENDPOINT, then tcp://127.0.0.1:7235. When that is the
    broker of the run this process belongs to (patch_dingengine() prepared one), the broker
    is started now if no process of the run has started it yet."""
    if explicit:
        return str(explicit)
    value = cfg_get(cfg, "broker", "rlbus_endpoint")
    if not value:
        value = cfg_get(cfg_get(cfg, "rlbus"), "endpoint")
    if not value:
        value = os.environ.get(ENDPOINT_ENV)
        if value and os.environ.get(RUN_LOCK_ENV):
            from .. import _run
            if value == _run.run_endpoint():
                return _run.ensure_broker()
    return str(value) if value else DEFAULT_ENDPOINT


def curve_kwargs() -> Dict[str, Any]:
    """`{"curve": keys}` when $RLBUS_CURVE_KEY and $RLBUS_BROKER_KEY name key files (the
    broker has CURVE on), else `{}`; ValueError when only one is set or a file is bad."""
    own, broker = os.environ.get(CURVE_KEY_ENV), os.environ.get(BROKER_KEY_ENV)
    if not own and not broker:
        return {}
    if not own or not broker:
        raise ValueError("set both {} (this process's .key file) and {} (the broker's .pub "
                         "file), or neither".format(CURVE_KEY_ENV, BROKER_KEY_ENV))
    return {"curve": sdk().curve_keys_from_files(own, broker)}


def valid_id(text: object) -> bool:
    return isinstance(text, str) and bool(_ID_RE.match(text))


def clean_id(text: object, fallback: str = "worker") -> str:
    """`text` made to obey the peer/task id rule: other characters become '_', cut to 128."""
    text = _ID_BAD_CHAR.sub("_", str(text))[:128]
    return text or fallback


def plain(value: Any) -> Any:
    """A copy of `value` as JSON would have carried it: dicts with str keys, lists for
    tuples/sets, numbers and strings as they are, numpy values as Python values.
    Anything else becomes its str(), as the HTTP transport could not have sent it either."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars
    if callable(tolist):
        try:
            return plain(tolist())
        except Exception:  # noqa: BLE001 - fall through to str()
            pass
    return str(value)


def coerce_resources(raw: Any, logger: Optional[logging.Logger] = None) -> Dict[str, float]:
    """DI-engine resource dicts -> the wire's {name: non-negative finite number}.

    Numbers stay, numeric strings ('20', '1.5') are parsed, anything else (e.g. 'xxx',
    negative or infinite values, bad names) is dropped and logged. At most 32 entries."""
    logger = logger or log
    out: Dict[str, float] = {}
    if not isinstance(raw, dict):
        if raw is not None:
            logger.warning("resources %r are not a dict: none announced", raw)
        return out
    for name, value in raw.items():
        name_s = str(name)
        if not (1 <= len(name_s.encode("utf-8")) <= 64):
            logger.warning("resource name %r is empty or longer than 64 bytes: dropped", name)
            continue
        number: Optional[float] = None
        if isinstance(value, bool):
            number = float(int(value))
        elif isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        else:
            item = getattr(value, "item", None)
            if callable(item):
                try:
                    number = float(item())
                except (TypeError, ValueError):
                    number = None
        if number is None or not math.isfinite(number) or number < 0:
            logger.warning("resource %s=%r is not a non-negative number: dropped", name_s, value)
            continue
        out[name_s] = int(number) if number.is_integer() and number < 2**53 else number
    if len(out) > 32:
        logger.warning("more than 32 resources: only the first 32 by name are announced")
        out = dict(sorted(out.items())[:32])
    return out


def seconds_to_ms(value: Any) -> Optional[int]:
    """A timeout in seconds (config) -> whole ms in the wire's 1..86400000, None stays."""
    if value is None:
        return None
    ms = int(round(float(value) * 1000))
    return max(1, min(ms, 86400000))
