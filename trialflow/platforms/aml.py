"""Azure ML training service through the supported v2 SDK ``azure-ai-ml`` (the ``aml`` extra,
imported on first use; docs/platforms.md#azure-ml, docs/nni.md#platform-requests). ``azureml-core`` (v1) is past its end
of support and cannot be pointed at a test endpoint.

The client is ``MLClient(credential, subscriptionId, resourceGroup, workspaceName)``. The credential
comes from the config's ``credentials`` block -- a service principal (``ClientSecretCredential``), a
managed identity (``ManagedIdentityCredential``) -- or else azure-identity's ``DefaultAzureCredential``
(environment, managed identity, ``az login``). ``prepare`` reads one job name: a refusal there is a
clear credentials error before any trial.

Code delivery. Jobs mount the workspace datastore ``datastore`` (path ``datastorePath``) read-write
as the input ``nni``; this machine sees the same file share or blob container at
``localStorageMountPoint`` (mounted with SMB or blobfuse). Code, the trial runtime, trial files and
metrics tokens go there, so nothing is uploaded per job; a real workspace needs that datastore and
the mount on this machine, and compute that can pull ``dockerImage``.

A trial (or, with ``reuseMode: true``, the default as NNI's AML environments, an environment) is one
``command()`` job named ``nni_exp_<exp>_trial_<trial>`` (``..._env_<env>``; lowercase, with the
ids' letter case kept in a suffix, as Azure ML job names are case-insensitive) in experiment
``nni_exp_<exp>``, created with ``jobs.create_or_update`` after ``jobs.get`` found no job of that name
(job names are unique in a workspace: a retried submit never makes a second one). Status is
``jobs.get(name).status``; cancel is ``jobs.begin_cancel``. Metrics come back over HTTP to
``nniManagerIp`` with per-trial tokens, with the trial's stdout on the datastore as the fallback
(the AML run's own metrics API is not read).

State table (``status``, docs/platforms.md#job-states):

===============================================================  ===================================
NotStarted, Starting, Provisioning, Preparing, Queued, Paused    WAITING
Running, Finalizing                                              RUNNING
Completed                                                        SUCCEEDED
Failed, NotResponding                                            FAILED
CancelRequested, Canceled                                        USER_CANCELED / EARLY_STOPPED when
                                                                 trialflow cancelled it, otherwise
                                                                 SYS_CANCELED
(anything else, Unknown)                                         the previous state, logged
===============================================================  ===================================

Interruptions (docs/platforms.md#interruptions): a job Azure ML queues again after it ran (as it does
when the low-priority or spot node under it is preempted) while the trial's run recorded no end of its
own, or a job that ended while the compute lists its node as ``preempted`` (``compute.list_nodes``).
The job run again finds the trial claimed and runs nothing; the trial runs again as a new job.
``jobTier: Spot`` asks for spot capacity (the job's queue settings).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..blocks import AzureMLCredentials, load_block
from ..config.sections.aml import AmlConfig
from ..foundation.ids import lowercase_id
from .base import PlatformError, TransientPlatformError, TrialStatus
from .errors import http_error
from .mounted_share import MountedShare
from .platform_row import Platform
from .rest_api import reveal, scrub
from .rest_jobs import RestJobService

T = TypeVar("T")
log = logging.getLogger("trialflow.platforms")
INPUT = "nni"
STATES = {
    **dict.fromkeys(("NotStarted", "Starting", "Provisioning", "Preparing", "Queued", "Paused"), TrialStatus.WAITING),
    "Running": TrialStatus.RUNNING, "Finalizing": TrialStatus.RUNNING,
    "Completed": TrialStatus.SUCCEEDED,
    "Failed": TrialStatus.FAILED, "NotResponding": TrialStatus.FAILED,
    "CancelRequested": TrialStatus.SYS_CANCELED, "Canceled": TrialStatus.SYS_CANCELED,
}
REQUEUED = ("Starting", "Provisioning", "Preparing", "Queued")  # after Running: Azure ML runs the job again


def _sdk() -> Any:
    try:
        import azure.ai.ml as ml
        import azure.identity  # noqa: F401 -- the credentials live there
    except ImportError:
        raise PlatformError("the aml platform needs the Azure ML SDK: pip install 'trialflow[aml]'") from None
    logging.getLogger("azure.ai.ml").setLevel(logging.ERROR)  # "experimental class" notices on every import
    return ml


class AzureMLTrainingService(RestJobService[AmlConfig]):
    platform = "aml"
    label = "Azure ML"

    def __init__(self, config: AmlConfig, experiment_dir: Path) -> None:
        super().__init__(config, experiment_dir)
        self._secrets: list[str] = []
        self._ran: set[str] = set()  # jobs seen Running

    def credential(self) -> Any:
        """The azure-identity credential of the config (see the module docstring)."""
        from azure.identity import ClientSecretCredential, DefaultAzureCredential, ManagedIdentityCredential

        if not self.config.credentials:
            return DefaultAzureCredential()
        block = load_block(AzureMLCredentials, self.config.credentials)
        if block.client_secret is not None:
            if not block.tenant_id or not block.client_id:
                raise PlatformError(f"Azure ML credentials block {self.config.credentials!r}: a client_secret needs "
                                    "tenant_id and client_id")
            secret = reveal(block.client_secret, "client_secret", "Azure ML credentials")
            self._secrets.append(secret)
            return ClientSecretCredential(block.tenant_id, block.client_id, secret)
        if block.managed_identity:
            return ManagedIdentityCredential(client_id=block.client_id) if block.client_id else \
                ManagedIdentityCredential()
        if block.use_default_credential:
            return DefaultAzureCredential()
        raise PlatformError(f"Azure ML credentials block {self.config.credentials!r} holds no credential: set "
                            "client_secret (with tenant_id and client_id), managed_identity or use_default_credential")

    def connect(self) -> Any:
        ml = _sdk()
        config = self.config
        return ml.MLClient(self.credential(), config.subscription_id, config.resource_group, config.workspace_name,
                           enable_telemetry=False)

    def platform_address(self) -> str:
        return os.environ.get("AZUREML_DEV_URL_MFE") or "https://management.azure.com"

    def _call(self, what: str, fn: Callable[[], T], exists_ok: bool = False) -> T | None:
        """``fn()`` with the SDK's errors as platform errors: connection errors, 5xx and 429 are
        transient; 401/403 a credentials error; others permanent (a 404 stays ResourceNotFoundError,
        the callers' "no such job"; with ``exists_ok`` a 409 -- the job exists -- is None). Messages
        are scrubbed of secrets."""
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceNotFoundError,
            ServiceRequestError,
        )

        shown = f"Azure ML {what} in workspace {self.config.workspace_name}"
        try:
            return fn()
        except ResourceNotFoundError:
            raise  # the callers' answer: no such job
        except ClientAuthenticationError as exc:
            raise PlatformError(f"{shown}: the credential was refused ({self._text(exc)}); check the Azure ML "
                                "credentials block (or az login / the managed identity) and its role on the "
                                "workspace") from None
        except HttpResponseError as exc:
            status = exc.status_code or 0
            if status == 409 and exists_ok:
                return None
            raise http_error(status, f"{shown}: HTTP {status}: {self._text(exc)}",
                             f"{shown} refused the credential (HTTP {status}: {self._text(exc)}); check the Azure ML "
                             "credentials block (or az login / the managed identity) and its role on the "
                             "workspace") from None
        except (ServiceRequestError, ConnectionError, TimeoutError) as exc:
            raise TransientPlatformError(f"{shown}: the service did not answer ({self._text(exc)})") from None

    def _text(self, exc: BaseException) -> str:
        message = getattr(exc, "message", None) or str(exc)
        return scrub(str(message).splitlines()[0] if message else type(exc).__name__, self._secrets)[:400]

    def _get(self, name: str) -> Any:
        """The job ``name``, None when there is none."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._call("jobs.get", lambda: self.api.jobs.get(name))
        except ResourceNotFoundError:
            return None

    def check_platform(self) -> None:
        self.check_receiver_reachable()
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._call("jobs.get", lambda: self.api.jobs.get(f"nni_exp_{self.experiment_id}_credential_check"))
        except ResourceNotFoundError:
            pass  # credentials accepted; no such job, as expected

    # ---- what the shared-storage base asks ------------------------------------------------------

    def make_storage(self) -> MountedShare:
        return MountedShare(self.config.local_storage_mount_point, f"${{{{inputs.{INPUT}}}}}",
                             f"Azure ML datastore {self.config.datastore!r}")

    def roles(self) -> dict[str, str]:
        return {"trial": self.config.trial_command}

    def job_name(self, kind: str, ident: str) -> str:
        """NNI's names, lowercase: Azure ML job names are (the SDK lowercases them)."""
        return f"nni_exp_{self.experiment_id}_{kind}_{lowercase_id(ident)}"

    def command_job(self, name: str, command: list[str], token_ref: str) -> Any:
        """The ``command()`` job ``name`` running ``command`` with the datastore mounted."""
        ml = _sdk()
        from azure.ai.ml.entities import Environment

        config = self.config
        path = f"azureml://datastores/{config.datastore}/paths/{config.datastore_path.strip('/')}"
        return ml.command(command=self.shell_command(command, token_ref), name=name, display_name=name,
                          experiment_name=f"nni_exp_{self.experiment_id}", compute=config.compute_target,
                          environment=Environment(image=config.docker_image),
                          inputs={INPUT: ml.Input(type="uri_folder", path=path, mode="rw_mount")},
                          job_tier=config.job_tier)

    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        if self._get(name) is not None:
            return  # an earlier attempt created it although its answer was lost
        job = self.command_job(name, commands["trial"], token_ref)
        # 409: the SDK's own retry of a create whose answer was lost found the job made
        self._call("jobs.create_or_update", lambda: self.api.jobs.create_or_update(job), exists_ok=True)

    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        job = self._get(name)
        if job is None:
            return None
        state = str(getattr(job.status, "value", job.status) or "Unknown")
        if state == "Running":
            self._ran.add(name)
        elif state in REQUEUED and name in self._ran:
            self.note_restart(name, f"it ran, then was {state} again")
        return self.outcome(name, state, STATES)

    def job_interruption(self, name: str, state: dict[str, Any]) -> str | None:
        """A job Azure ML queued again after it ran (as it does when the node under it is preempted),
        whose trial run recorded no end of its own, or one whose node the compute lists as preempted."""
        return super().job_interruption(name, state) or self._preempted_node(name)

    def _preempted_node(self, name: str) -> str | None:
        """The compute's word that the node under job ``name`` was preempted; None when it has none,
        or the compute cannot be read (a serverless job, no permission: logged)."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            nodes = self._call("compute.list_nodes",
                               lambda: list(self.api.compute.list_nodes(self.config.compute_target)))
        except ResourceNotFoundError:
            return None
        except PlatformError as exc:
            if isinstance(exc, TransientPlatformError):
                raise
            log.info("job %s: its compute's nodes cannot be read, so a preempted node is not seen: %s", name, exc)
            return None
        for node in nodes or []:
            # the SDK's AmlComputeNodeInfo copies the REST fields in, named as the service spells them
            # (nodeId, nodeState, runId) by some API versions and in snake case by others
            info = vars(node)
            field = {key: info.get(key) or info.get(rest) for key, rest in
                     (("node_id", "nodeId"), ("node_state", "nodeState"), ("run_id", "runId"))}
            if field["run_id"] == name and str(field["node_state"]).lower() == "preempted":
                return f"Azure ML preempted node {field['node_id']} of compute {self.config.compute_target} " \
                    f"under job {name}"
        return None

    def sole_primary(self) -> bool:
        return True  # a command job on one node

    def delete_job(self, name: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._call("jobs.begin_cancel", lambda: self.api.jobs.begin_cancel(name))
        except ResourceNotFoundError:
            pass
        except PlatformError as exc:  # already ended: nothing left to cancel
            if isinstance(exc, TransientPlatformError):
                raise
        self.forget_state(name)
        self._ran.discard(name)


PLATFORM = Platform(AmlConfig, AzureMLTrainingService, AzureMLCredentials, "aml")
