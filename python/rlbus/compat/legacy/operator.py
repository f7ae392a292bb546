"""A small client of DI-orchestrator's operator server (replica API v1alpha1).

In operator mode DI-engine's coordinator asks the operator for worker replicas, polls the
replica list every second and reports replicas it could not reach. Over rlbus the workers
find the broker themselves, so this client is only used to ask for them, to watch the
list, and to report replicas that went away. Every request has a timeout.
"""

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from .._util import cfg_get

DEFAULT_NAMESPACE = "default"
DEFAULT_POD_NAME = "coordinator"
DEFAULT_API_VERSION = "v1alpha1"

# An operator answer: (success, code, message, data).
_Reply = Tuple[bool, Optional[int], Optional[str], Any]


def _split_addr(addr: object) -> Tuple[str, int]:
    """'https://host:port', 'host:port' or 'host' -> (host, port). The scheme is ignored
    (DI-engine's client spoke plain HTTP whatever the address said)."""
    text = str(addr).strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.split("/", 1)[0]
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return text, 80


class OperatorClient:
    """Replica requests to one operator server, as the coordinator `name` in `namespace`."""

    def __init__(self, operator_cfg: Any, logger: Optional[logging.Logger] = None,
                 timeout_s: float = 5.0) -> None:
        self._log = logger or logging.getLogger("rlbus.compat")
        addr = cfg_get(operator_cfg, "system_addr") or os.environ.get("KUBERNETES_SERVER_URL")
        if not addr:
            raise ValueError("operator_server.system_addr (or $KUBERNETES_SERVER_URL) is not set")
        self.host, self.port = _split_addr(addr)
        self.api_version = (cfg_get(operator_cfg, "api_version")
                            or os.environ.get("KUBERNETES_SERVER_API_VERSION")
                            or DEFAULT_API_VERSION)
        self.namespace = os.environ.get("KUBERNETES_POD_NAMESPACE", DEFAULT_NAMESPACE)
        self.name = os.environ.get("KUBERNETES_POD_NAME", DEFAULT_POD_NAME)
        self._timeout = timeout_s

    def _url(self, path: str, query: Optional[Mapping[str, str]] = None) -> str:
        url = "http://{}:{}/{}/{}".format(self.host, self.port, self.api_version, path)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return url

    def _request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                 query: Optional[Mapping[str, str]] = None) -> _Reply:
        """(success, code, message, data); a network error is an unsuccessful answer."""
        data: Optional[bytes] = None
        headers: Dict[str, str] = {}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self._url(path, query), data=data, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as resp:
                payload = json.loads(resp.read().decode("utf-8") or "{}")
        except urllib.error.HTTPError as exc:
            try:
                payload = json.loads(exc.read().decode("utf-8") or "{}")
            except ValueError:
                return False, exc.code, str(exc), None
        except (OSError, ValueError) as exc:
            return False, None, str(exc), None
        if not isinstance(payload, dict):
            return False, None, "operator answered %r" % (payload,), None
        return (bool(payload.get("success")), payload.get("code"), payload.get("message"),
                payload.get("data"))

    def _who(self) -> Dict[str, str]:
        return {"namespace": self.namespace, "coordinator": self.name}

    def post_replicas(self, request: Optional[Mapping[str, Any]]) -> _Reply:
        body = dict(request or {})
        body.update(self._who())
        return self._request("POST", "replicas", body)

    def get_replicas(self) -> _Reply:
        return self._request("GET", "replicas", query=self._who())

    def post_replicas_failed(self, collectors: Iterable[str] = (),
                             learners: Iterable[str] = ()) -> _Reply:
        body: Dict[str, Any] = {"collectors": list(collectors), "learners": list(learners)}
        body.update(self._who())
        return self._request("POST", "replicas/failed", body)


def pod_name(replica: object) -> str:
    """'pod.ns:port' -> 'pod' (the name the operator expects in a failure report)."""
    dns = str(replica).split(":")[0]
    parts = dns.split(".")
    return ".".join(parts[:-1]) if len(parts) > 1 else dns
