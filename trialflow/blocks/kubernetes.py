"""Prefect block holding a kubeconfig for the Kubernetes training services (kubeflow,
frameworkcontroller, adl).

A config's ``credentials: <block name>`` loads this block; ``credentials: <type slug>/<name>`` loads
any block, for example prefect-kubernetes' ``kubernetes-credentials/<name>`` when that collection is
installed (its ``cluster_config`` is used). Without a block, ``KUBECONFIG`` or ``~/.kube/config`` is
read, or the in-cluster service account when running in a pod. The kubeconfig text is a
``SecretStr``: masked in the Prefect UI, never in flow parameters, logs or error messages::

    KubernetesCredentials(kubeconfig=Path("~/.kube/config").expanduser().read_text()).save("prod")
"""

from __future__ import annotations

from typing import Any

import yaml
from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from ..tasks.training_services.base import PlatformError


class KubernetesCredentials(Block):
    """A kubeconfig (its text) and, optionally, which of its contexts to use."""

    _block_type_name = "trialflow Kubernetes Credentials"
    _block_type_slug = "trialflow-kubernetes-credentials"
    _description = "kubeconfig for trialflow's Kubernetes training services (Kubeflow, FrameworkController, AdaptDL)."

    kubeconfig: SecretStr = Field(description="the kubeconfig file's text (YAML)")
    context: str | None = Field(default=None, description="context to use (default: the file's current-context)")

    def config_dict(self) -> tuple[dict[str, Any], str | None]:
        try:
            data = yaml.safe_load(self.kubeconfig.get_secret_value())
        except yaml.YAMLError:
            raise PlatformError("the kubeconfig in the Kubernetes credentials block is not valid YAML") from None
        if not isinstance(data, dict):
            raise PlatformError("the kubeconfig in the Kubernetes credentials block is not a kubeconfig mapping")
        return data, self.context


def load_kubeconfig_block(name: str) -> tuple[dict[str, Any], str | None]:
    """The kubeconfig dict and context of a saved block (ours, or prefect-kubernetes' by slug)."""
    try:
        block: Any = Block.load(name) if "/" in name else KubernetesCredentials.load(name)
    except (ValueError, KeyError) as exc:
        raise PlatformError(f"Kubernetes credentials block {name!r} not found ({exc}); create it with "
                            f"KubernetesCredentials(kubeconfig=...).save({name!r}) or in the Prefect UI") from None
    if isinstance(block, KubernetesCredentials):
        return block.config_dict()
    cluster = getattr(block, "cluster_config", None)
    if cluster is not None and isinstance(getattr(cluster, "config", None), dict):
        return cluster.config, getattr(cluster, "context_name", None)
    raise PlatformError(f"block {name!r} holds no kubeconfig: use a trialflow or prefect-kubernetes Kubernetes "
                        "credentials block")
