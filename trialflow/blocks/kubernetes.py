"""Prefect block holding a kubeconfig for the Kubernetes training services (kubeflow,
frameworkcontroller, adl).

A config's ``credentials: <block name>`` loads this block; ``credentials: <type slug>/<name>`` loads
any block, for example prefect-kubernetes' ``kubernetes-credentials/<name>`` when that collection is
installed (its ``cluster_config`` is used). Without a block, ``KUBECONFIG`` or ``~/.kube/config`` is
read, or the in-cluster service account when running in a pod::

    KubernetesCredentials(kubeconfig=Path("~/.kube/config").expanduser().read_text()).save("prod")
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class KubernetesCredentials(Block):
    """A kubeconfig (its text) and, optionally, which of its contexts to use."""

    _block_type_name = "trialflow Kubernetes Credentials"
    _block_type_slug = "trialflow-kubernetes-credentials"
    _description = "kubeconfig for trialflow's Kubernetes training services (Kubeflow, FrameworkController, AdaptDL)."

    kubeconfig: SecretStr = Field(description="the kubeconfig file's text (YAML)")
    context: str | None = Field(default=None, description="context to use (default: the file's current-context)")
