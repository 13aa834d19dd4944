"""A Kubernetes API server emulator for tests: real HTTP on 127.0.0.1, spoken to by the official
``kubernetes`` client through an ordinary kubeconfig (bearer token checked).

It serves what trialflow's Kubernetes services use: namespaces, pods (their logs and the Eviction
API's ``eviction`` subresource), secrets,
configmaps, persistentvolumeclaims, and the custom resources ``kubeflow.org/v1`` tfjobs and
pytorchjobs, ``frameworkcontroller.microsoft.com/v1`` frameworks and ``adaptdl.petuum.com/v1``
adaptdljobs: create, get, list with label selectors, patch (JSON patch and merge patch), delete,
``/status``. Custom objects are validated against the published CRD schemas plus the operators'
webhook checks (:mod:`.k8s_schemas`); an invalid one is refused with 422 and a Status message like
a real API server's. A built-in controller (:mod:`.k8s_operators`) plays the operators: it runs each
replica's container command as a local process and writes status the way each operator does.

Fault knobs and lifecycle are :mod:`.http_server`'s; ``stop()`` also kills every pod process.
"""

from __future__ import annotations

import base64
import copy
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .http_server import EmulatorServer, Request
from .k8s_operators import Controller
from .k8s_schemas import validate_custom_object

CUSTOM_RESOURCES = {
    ("kubeflow.org", "v1", "tfjobs"): "TFJob",
    ("kubeflow.org", "v1", "pytorchjobs"): "PyTorchJob",
    ("frameworkcontroller.microsoft.com", "v1", "frameworks"): "Framework",
    ("adaptdl.petuum.com", "v1", "adaptdljobs"): "AdaptDLJob",
}
CORE_RESOURCES = {"pods": "Pod", "secrets": "Secret", "configmaps": "ConfigMap",
                  "persistentvolumeclaims": "PersistentVolumeClaim", "namespaces": "Namespace"}
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>log|status|eviction))?/?$")


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


@dataclass
class Cluster:
    """The objects the API server holds, by (plural, namespace, name); one lock for all."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    version: int = 0

    def put(self, plural: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.objects[(plural, ns, obj["metadata"]["name"])] = obj
            return obj

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get((plural, ns, name))

    def remove(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.pop((plural, ns, name), None)

    def items(self, plural: str, ns: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [o for (p, n, _), o in self.objects.items() if p == plural and (ns is None or n == ns)]


def match_labels(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors: ``a=b,c==d,e!=f,g,!h``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op.get("path", "")).split("/")[1:]]
        if not parts:
            raise ApiError(422, "Invalid", f"json patch: bad path {op.get('path')!r}")
        parent: Any = obj
        try:
            for part in parts[:-1]:
                parent = parent[int(part)] if isinstance(parent, list) else parent[part]
            last = parts[-1]
            if op.get("op") in ("add", "replace"):
                if isinstance(parent, list):
                    parent.insert(len(parent) if last == "-" else int(last), op["value"])
                else:
                    parent[last] = op["value"]
            elif op.get("op") == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            else:
                raise ApiError(422, "Invalid", f"json patch: unsupported op {op.get('op')!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"json patch: path {op.get('path')!r} does not exist") from None
    return obj


class KubernetesEmulator(EmulatorServer):
    """See the module docstring. ``nfs_exports`` maps ``"server:/path"`` to the local directory that
    NFS volumes of that export are mounted from; ``directory`` holds pod logs and other volumes."""

    def __init__(self, directory: Path, nfs_exports: dict[str, Path] | None = None, kill_grace: float = 2.0,
                 token: str | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        super().__init__()
        self.token = token or secrets.token_urlsafe(16)
        self.cluster = Cluster()
        self.controller = Controller(self.cluster, self.directory, dict(nfs_exports or {}), kill_grace)
        for ns in ("default",):
            self.cluster.put("namespaces", "", self._new("Namespace", "v1", {"metadata": {"name": ns}}, ""))

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> KubernetesEmulator:
        super().start()
        self.controller.start()
        return self

    def on_stop(self) -> None:
        self.controller.stop()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """An ordinary kubeconfig file pointing at this emulator."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator", "preferences": {},
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": self.token}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                          "namespace": namespace}}],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        return path

    # ---- the HTTP side --------------------------------------------------------------------

    def fault_body(self, status: int) -> Any:
        return ApiError(status, "ServiceUnavailable",
                        "injected fault: the server is currently unable to handle the request").status()

    def respond(self, request: Request) -> tuple[int, Any]:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, ApiError(401, "Unauthorized", "Unauthorized").status()
        try:
            code, body = self.handle(request.method, request.path, request.query, request.json(),
                                     request.headers.get("Content-Type", ""))
            with self.cluster.lock:  # answered as a copy: the operators change the objects in place meanwhile
                return code, copy.deepcopy(body)
        except ApiError as exc:
            return exc.code, exc.status()
        except ValueError as exc:
            return 400, ApiError(400, "BadRequest", f"the request body is not JSON: {exc}").status()

    # ---- object access for tests ----------------------------------------------------------

    def objects(self, plural: str, namespace: str = "default") -> list[dict[str, Any]]:
        """Copies of the objects of ``plural``, taken under the cluster's lock (the operators change
        objects in place while they run)."""
        with self.cluster.lock:
            return copy.deepcopy(self.cluster.items(plural, namespace))

    def disrupt(self, pod: str, namespace: str = "default", reason: str = "TerminationByKubelet",
                message: str = "The node was low on resource: memory.") -> None:
        """End a running pod as Kubernetes would for ``reason`` (a ``DisruptionTarget`` reason:
        ``PreemptionByScheduler``, ``DeletionByTaintManager``, ``EvictionByEvictionAPI``,
        ``TerminationByKubelet``); see :meth:`Controller.disrupt`. Raises LookupError when it is not running."""
        self.controller.disrupt(namespace, pod, reason, message)

    def count(self, method: str, plural: str) -> int:
        return sum(1 for m, p in self.requests if m == method and re.search(rf"/{plural}(/|$|\?)", p))

    # ---- API ------------------------------------------------------------------------------

    @staticmethod
    def _new(kind: str, api_version: str, body: dict[str, Any], ns: str) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["kind"], obj["apiVersion"] = kind, api_version
        meta = obj.setdefault("metadata", {})
        meta.update({"uid": str(uuid.uuid4()), "creationTimestamp": now_iso()})
        if ns:
            meta["namespace"] = ns
        meta.setdefault("labels", {})
        return obj

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any, content_type: str
               ) -> tuple[int, Any]:
        match = _PATH.match(path)
        if match is None:
            if path in ("/version", "/version/"):
                return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-trialflow-emulator"}
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        group, version, ns, plural, name, sub = match.group("group", "version", "ns", "plural", "name", "sub")
        if group:
            kind = CUSTOM_RESOURCES.get((group, version, plural))
            api_version = f"{group}/{version}"
        else:
            kind, api_version = CORE_RESOURCES.get(plural), "v1"
        if kind is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns = ns or ""
        if plural != "namespaces" and ns and self.cluster.get("namespaces", "", ns) is None and method == "POST":
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        resource = f"{plural}.{group}" if group else plural
        if name is None:
            if method == "GET":
                selector = (query.get("labelSelector") or [""])[0]
                items = [o for o in self.cluster.items(plural, ns or None)
                         if match_labels(o["metadata"].get("labels") or {}, selector)]
                return 200, {"kind": f"{kind}List", "apiVersion": api_version,
                             "metadata": {"resourceVersion": str(self.cluster.version)}, "items": items}
            if method == "POST":
                return 201, self._create(plural, kind, api_version, ns, body, resource, group is not None)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")
        with self.cluster.lock:
            obj = self.cluster.get(plural, ns, name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            if sub == "log":
                return 200, self.controller.pod_log(ns, name, query)
            if sub == "eviction" and plural == "pods" and method == "POST":
                return 201, self._evict(ns, name, body)
            if method == "GET":
                return 200, obj
            if method == "DELETE":
                self.cluster.remove(plural, ns, name)
                self.controller.deleted(plural, ns, name, obj)
                if plural not in ("secrets", "configmaps"):  # these answer a Status, the others the object
                    obj["metadata"]["deletionTimestamp"] = now_iso()
                    return 200, obj
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "details": {"name": name, "kind": plural, "uid": obj["metadata"]["uid"]}}
            if method in ("PATCH", "PUT"):
                return 200, self._update(plural, ns, obj, body, content_type, resource, sub, group is not None)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def _evict(self, ns: str, name: str, body: Any) -> dict[str, Any]:
        """The Eviction API (``policy/v1`` Eviction, as ``kubectl drain`` sends): the pod is disrupted
        with reason ``EvictionByEvictionAPI`` (no PodDisruptionBudget is emulated)."""
        if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction" or \
                (body.get("metadata") or {}).get("name") != name:  # the kind may be left to the URL
            raise ApiError(400, "BadRequest", f"the body of an eviction of pod {name} must be a policy/v1 Eviction "
                                              "naming it")
        try:
            self.controller.start_disruption(ns, name, "EvictionByEvictionAPI", "Eviction API: evicting")
        except LookupError as exc:
            raise ApiError(429, "TooManyRequests", f"Cannot evict pod as it would violate the pod's disruption "
                                                   f"budget: {exc}") from None
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}

    def _create(self, plural: str, kind: str, api_version: str, ns: str, body: Any, resource: str,
                custom: bool) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        name = str((body.get("metadata") or {}).get("name") or "")
        if custom:
            if body.get("kind") != kind or body.get("apiVersion") != api_version:
                raise ApiError(400, "BadRequest", f"the object's kind/apiVersion must be {kind} {api_version}, got "
                                                  f"{body.get('kind')} {body.get('apiVersion')}")
            problems = validate_custom_object(plural, body)
            if problems:
                raise ApiError(422, "Invalid", f'{kind}.{api_version.split("/")[0]} "{name}" is invalid: '
                                               + "; ".join(problems))
        elif not name:
            raise ApiError(422, "Invalid", f"{kind}: metadata.name: Required value")
        with self.cluster.lock:
            if self.cluster.get(plural, ns, name) is not None:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists')
            obj = self._new(kind, api_version, body, ns)
            if plural == "secrets":
                self._check_secret(obj)
            obj.pop("status", None)
            if plural == "persistentvolumeclaims":
                obj["status"] = {"phase": "Bound", "accessModes": obj.get("spec", {}).get("accessModes", [])}
            self.cluster.put(plural, ns, obj)
        return obj

    @staticmethod
    def _check_secret(obj: dict[str, Any]) -> None:
        for key, value in (obj.get("data") or {}).items():
            try:
                base64.b64decode(value, validate=True)
            except (ValueError, TypeError):
                raise ApiError(422, "Invalid", f"Secret: data[{key}]: must be base64") from None
        for key, value in (obj.pop("stringData", None) or {}).items():
            obj.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode()

    def _update(self, plural: str, ns: str, obj: dict[str, Any], body: Any, content_type: str, resource: str,
                sub: str | None, custom: bool) -> dict[str, Any]:
        if "json-patch" in content_type:
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            updated = _json_patch(obj, body)
        else:
            updated = _merge(obj, body)
        updated["metadata"]["name"] = obj["metadata"]["name"]
        if sub != "status":
            updated["status"] = obj.get("status")
        if custom:
            problems = validate_custom_object(plural, updated)
            if problems:
                raise ApiError(422, "Invalid", f'{resource} "{obj["metadata"]["name"]}" is invalid: '
                               + "; ".join(problems))
        self.cluster.put(plural, ns, updated)
        self.controller.updated(plural, ns, updated)
        return updated
