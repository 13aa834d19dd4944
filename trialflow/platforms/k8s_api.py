"""Kubernetes plumbing shared by the kubeflow, frameworkcontroller and adl services: the API client
(with errors turned into ours), credentials from a kubeconfig or a block, NNI's object names and labels.

The ``kubernetes`` client is an optional extra (``pip install 'trialflow[kubernetes]'``) imported
only when a Kubernetes service is used.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import yaml

from ..blocks import BlockNotFoundError, KubernetesCredentials, load_block
from ..foundation.ids import lowercase_id as k8s_id
from .base import PlatformError, TransientPlatformError
from .errors import http_error

LABEL_APP = "nni-kubernetes-trial"
CONTAINER_MOUNT = "/tmp/mount"
REQUEST_TIMEOUT = (5.0, 30.0)


class NotFound(PlatformError):
    """The object does not exist (HTTP 404)."""


def kubernetes_module() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise PlatformError("the Kubernetes training services need the kubernetes client: "
                            "pip install 'trialflow[kubernetes]'") from None
    return kubernetes


def labels(experiment_id: str, **ids: str) -> dict[str, str]:
    """NNI's labels on Kubernetes objects: ``app``, ``expId`` and ``trialId`` or ``envId``."""
    return {"app": LABEL_APP, "expId": experiment_id, **{k: k8s_id(v) for k, v in ids.items()}}


def new_api_client(credentials: str | None) -> Any:
    """An ApiClient from a credentials block, ``KUBECONFIG``/``~/.kube/config``, or in-cluster."""
    kubernetes = kubernetes_module()
    try:
        if credentials:
            config, context = kubeconfig_from_block(credentials)
            return kubernetes.config.new_client_from_config_dict(config, context=context)
        path = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
        if os.path.isfile(path):
            return kubernetes.config.new_client_from_config(config_file=path)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config()
            return kubernetes.client.ApiClient()
    except kubernetes.config.ConfigException as exc:
        raise PlatformError(f"the kubeconfig cannot be used: {exc}") from None
    raise PlatformError(f"no kubeconfig found at {path}: set KUBECONFIG, write ~/.kube/config, or name a "
                        "Kubernetes credentials block with 'credentials'")


def kubeconfig_from_block(name: str) -> tuple[dict[str, Any], str | None]:
    """The kubeconfig dict and context of a saved block (ours, or prefect-kubernetes' by slug)."""
    try:
        block = load_block(KubernetesCredentials, name)
    except BlockNotFoundError as exc:
        raise PlatformError(str(exc)) from None
    if isinstance(block, KubernetesCredentials):
        try:
            data = yaml.safe_load(block.kubeconfig.get_secret_value())
        except yaml.YAMLError:
            raise PlatformError(f"the kubeconfig in Kubernetes credentials block {name!r} is not valid YAML") from None
        if not isinstance(data, dict):
            raise PlatformError(f"the kubeconfig in Kubernetes credentials block {name!r} is not a kubeconfig mapping")
        return data, block.context
    cluster = getattr(block, "cluster_config", None)
    if cluster is not None and isinstance(getattr(cluster, "config", None), dict):
        return cluster.config, getattr(cluster, "context_name", None)
    raise PlatformError(f"block {name!r} holds no kubeconfig: use a trialflow or prefect-kubernetes Kubernetes "
                        "credentials block")


def _server_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason or exc)


class KubeApi:
    """The calls the services make, each with a timeout, and errors as PlatformError (refused),
    TransientPlatformError (5xx, 429, timeouts, dropped connections: retried) or NotFound."""

    def __init__(self, client: Any, namespace: str) -> None:
        kubernetes = kubernetes_module()
        client.configuration.retries = False  # our callers retry, knowing what is idempotent
        self.namespace = namespace
        self.host = str(client.configuration.host)  # the API server's URL
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self._api_exception = kubernetes.client.exceptions.ApiException

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import urllib3

        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except self._api_exception as exc:
            status, message = int(exc.status or 0), _server_message(exc)
            if status == 404:
                raise NotFound(f"{what}: not found ({message})") from None
            raise http_error(status, f"{what}: the Kubernetes API answered HTTP {status}: {message}",
                             f"{what}: the Kubernetes API refused the credentials (HTTP {status}): {message}; "
                             "check the kubeconfig or the credentials block") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientPlatformError(f"{what}: cannot reach the Kubernetes API server: {exc}") from None

    # ---- custom objects ----------------------------------------------------------------------

    def get_job(self, group: str, version: str, plural: str, name: str) -> dict[str, Any] | None:
        try:
            return self.call(f"reading {plural} {name}", self.custom.get_namespaced_custom_object, group, version,
                             self.namespace, plural, name)  # type: ignore[no-any-return]
        except NotFound:
            return None

    def create_job(self, group: str, version: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create unless it exists (the name is deterministic, so a retried submit finds its job)."""
        name = body["metadata"]["name"]
        existing = self.get_job(group, version, plural, name)
        if existing is not None:
            return existing
        try:
            return self.call(f"creating {plural} {name}", self.custom.create_namespaced_custom_object, group, version,
                             self.namespace, plural, body)  # type: ignore[no-any-return]
        except PlatformError as exc:
            if "already exists" in str(exc):
                return self.get_job(group, version, plural, name) or body
            raise

    def delete_job(self, group: str, version: str, plural: str, name: str) -> None:
        try:
            self.call(f"deleting {plural} {name}", self.custom.delete_namespaced_custom_object, group, version,
                      self.namespace, plural, name, body={"propagationPolicy": "Foreground"})
        except NotFound:
            pass

    # ---- core objects ------------------------------------------------------------------------

    def ensure_secret(self, name: str, data: dict[str, str], object_labels: dict[str, str],
                      kind: str = "Opaque") -> dict[str, str]:
        """Create the Secret unless it exists; returns its data (decoded) as stored."""
        try:
            found = self.call(f"reading secret {name}", self.core.read_namespaced_secret, name, self.namespace)
            return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}
        except NotFound:
            pass
        body = {"apiVersion": "v1", "kind": "Secret", "type": kind,
                "metadata": {"name": name, "labels": object_labels},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        try:
            self.call(f"creating secret {name}", self.core.create_namespaced_secret, self.namespace, body)
        except PlatformError as exc:
            if "already exists" not in str(exc):
                raise
        return data

    def read_secret(self, name: str) -> dict[str, str] | None:
        try:
            found = self.call(f"reading secret {name}", self.core.read_namespaced_secret, name, self.namespace)
        except NotFound:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}

    def delete(self, kind: str, name: str) -> None:
        fn = {"secret": self.core.delete_namespaced_secret, "configmap": self.core.delete_namespaced_config_map,
              "pvc": self.core.delete_namespaced_persistent_volume_claim}[kind]
        try:
            self.call(f"deleting {kind} {name}", fn, name, self.namespace)
        except NotFound:
            pass

    def ensure(self, kind: str, body: dict[str, Any]) -> None:
        """Create a ConfigMap or PersistentVolumeClaim unless it exists."""
        fn = {"configmap": self.core.create_namespaced_config_map,
              "pvc": self.core.create_namespaced_persistent_volume_claim}[kind]
        try:
            self.call(f"creating {kind} {body['metadata']['name']}", fn, self.namespace, body)
        except PlatformError as exc:
            if "already exists" not in str(exc):
                raise

    def check_namespace(self) -> None:
        try:
            self.call(f"reading namespace {self.namespace}", self.core.read_namespace, self.namespace)
        except NotFound:
            raise PlatformError(f"namespace {self.namespace!r} does not exist in the cluster; create it "
                                f"(kubectl create namespace {self.namespace}) or set namespace") from None

    def pods(self, selector: str) -> list[Any]:
        """The pods matching ``selector`` (the client's ``V1Pod`` objects)."""
        found = self.call("listing pods", self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        return list(found.items)

    def pod_logs(self, selector: str) -> dict[str, bytes]:
        """The logs (bytes) of the pods matching ``selector``, by pod name."""
        out = {}
        for pod in self.pods(selector):
            try:
                response = self.call(f"reading the log of pod {pod.metadata.name}",
                                     self.core.read_namespaced_pod_log, pod.metadata.name, self.namespace,
                                     _preload_content=False)
                out[pod.metadata.name] = bytes(response.data)
            except NotFound:
                continue
        return out


def azure_storage_key(vault: str, key: str) -> str:
    """The storage account key from Azure Key Vault, through the Azure CLI as NNI did."""
    try:
        result = subprocess.run(["az", "keyvault", "secret", "show", "--name", key, "--vault-name", vault,
                                 "--query", "value", "-o", "tsv"], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise PlatformError("azureStorage needs the Azure CLI (az) to read the storage key from Key Vault: install "
                            "it and run `az login`") from None
    if result.returncode != 0 or not result.stdout.strip():
        raise PlatformError(f"reading secret {key!r} from key vault {vault!r} failed: "
                            f"{result.stderr.strip()[-300:] or 'empty value'}")
    return result.stdout.strip()
