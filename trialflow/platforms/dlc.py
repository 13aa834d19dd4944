"""Alibaba Cloud PAI-DLC training service through the official SDK ``alibabacloud-pai-dlc20201203``
(the ``dlc`` extra, imported on first use; docs/platforms.md#pai-dlc, docs/nni.md#platform-requests).

The client is ``Client(Config(access_key_id, access_key_secret, region_id, endpoint, protocol))``:
the endpoint is the config's override, else the credentials block's, else
``pai-dlc.<region>.aliyuncs.com`` (``pai-dlc-share.aliyuncs.com`` for NNI's ``share`` region); an
``http://`` endpoint is spoken to in plain HTTP. ``prepare`` lists one job to check the AccessKey
(a refusal there is a clear credentials error before any trial).

A trial (or, with ``reuseMode: true``, the default as NNI ran DLC, an environment) is one job:
``create_job`` with NNI's request -- display name ``nni_exp_<exp>_trial_<trial>`` (``..._env_<env>``),
jobType, one job spec (type, image, podCount, ecsSpec), the NAS data source mounted at
``containerStorageMountPoint`` (and the OSS one, if given), the workspace. A submit first looks the
display name up (``list_jobs``), so a retried submit whose answer was lost never makes a second job.
Status is ``get_job(job_id, GetJobRequest())``; cancel is ``stop_job``. Code, runtime, trial files
and metrics tokens live on the NAS (``localStorageMountPoint`` here).

SDK errors are mapped once: a dropped connection, a timeout, HTTP 5xx and throttling (429, codes
``Throttling*``) are transient (retried); other refusals permanent, named with their code. Messages
are scrubbed of the AccessKey pair and of request signatures.

State table (``Status``, docs/platforms.md#job-states):

=====================================================================  =============================
Creating, Queuing, Dequeued, Bidding, EnvPreparing, SanityChecking     WAITING
Running, Restarting, SucceededReserving, FailedReserving               RUNNING
Succeeded                                                              SUCCEEDED
Failed                                                                 FAILED
Stopping, Stopped                                                      USER_CANCELED / EARLY_STOPPED
                                                                       when trialflow stopped it,
                                                                       otherwise SYS_CANCELED
(anything else)                                                        the previous state, logged
=====================================================================  =============================

Interruptions (docs/platforms.md#interruptions): a job with a pod PAI-DLC evicted (the pod's
``SubStatus: Evicted``, as when a spot instance is reclaimed), or one PAI-DLC restarts in place
(``Restarting``, ``RestartTimes``) while the trial's run recorded no end of its own: the replica run
again finds the trial claimed and runs nothing, and the trial runs again as a new job.
``spotDiscountLimit`` asks for spot instances (``SpotSpec``, SpotWithPriceLimit).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..blocks import PAIDLCCredentials, load_block
from ..config.sections.dlc import DlcConfig
from .base import PlatformError, TransientPlatformError, TrialStatus
from .errors import http_error
from .mounted_share import MountedShare
from .platform_row import Platform
from .rest_api import reveal, scrub
from .rest_jobs import RestJobService

T = TypeVar("T")
STATES = {
    **dict.fromkeys(("Creating", "Queuing", "Dequeued", "Bidding", "EnvPreparing", "SanityChecking"),
                    TrialStatus.WAITING),
    **dict.fromkeys(("Running", "Restarting", "SucceededReserving", "FailedReserving"), TrialStatus.RUNNING),
    "Succeeded": TrialStatus.SUCCEEDED,
    "Failed": TrialStatus.FAILED,
    "Stopping": TrialStatus.SYS_CANCELED,
    "Stopped": TrialStatus.SYS_CANCELED,
}
_SIGNATURE = re.compile(r"(Signature=|Credential=)[^,\s'\"]+")


def _sdk() -> tuple[Any, Any, Any]:
    try:
        from alibabacloud_pai_dlc20201203 import models
        from alibabacloud_pai_dlc20201203.client import Client
        from alibabacloud_tea_openapi.models import Config
    except ImportError:
        raise PlatformError("the dlc platform needs the PAI-DLC SDK: pip install 'trialflow[dlc]'") from None
    return Client, Config, models


def endpoint_of(region: str, endpoint: str | None) -> tuple[str, str]:
    """(endpoint, protocol) of the API: the override, else the region's public endpoint."""
    if endpoint:
        if endpoint.startswith("http://"):
            return endpoint[len("http://"):].rstrip("/"), "http"
        return endpoint.removeprefix("https://").rstrip("/"), "https"
    host = "pai-dlc-share.aliyuncs.com" if region == "share" else f"pai-dlc.{region}.aliyuncs.com"
    return host, "https"


class DLCTrainingService(RestJobService[DlcConfig]):
    platform = "dlc"
    label = "PAI-DLC"

    def __init__(self, config: DlcConfig, experiment_dir: Path) -> None:
        super().__init__(config, experiment_dir)
        self._key_id, self._key_secret, self.endpoint, self.protocol = self._login()
        self._secrets = [self._key_id, self._key_secret]

    def _login(self) -> tuple[str, str, str, str]:
        config = self.config
        key_id, key_secret, endpoint = config.access_key_id, config.access_key_secret, config.endpoint
        if config.credentials:
            block = load_block(PAIDLCCredentials, config.credentials)
            key_id, key_secret = block.access_key_id, block.access_key_secret
            endpoint = endpoint or block.endpoint
        assert key_id is not None and key_secret is not None  # the config's rule
        host, protocol = endpoint_of(config.region, endpoint)
        return (reveal(key_id, "accessKeyId", "PAI-DLC credentials"),
                reveal(key_secret, "accessKeySecret", "PAI-DLC credentials"), host, protocol)

    def connect(self) -> Any:
        client, config, _ = _sdk()
        return client(config(access_key_id=self._key_id, access_key_secret=self._key_secret,
                             region_id=self.config.region, endpoint=self.endpoint, protocol=self.protocol,
                             connect_timeout=5000, read_timeout=30000))

    def platform_address(self) -> str:
        return f"{self.protocol}://{self.endpoint}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` with the SDK's errors as platform errors (see the module docstring)."""
        try:
            return fn()
        except PlatformError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the SDK raises Tea/Dara exceptions of many kinds
            status = getattr(exc, "status_code", None)
            code = str(getattr(exc, "code", "") or "")
            text = getattr(exc, "message", None) or str(exc)
            text = _SIGNATURE.sub(r"\1**********", scrub(str(text), self._secrets))[:500]
            shown = f"PAI-DLC {what} at {self.platform_address()}"
            # classified by what the SDK's error code says where its status may not (throttled, the key
            # refused); the message keeps the status the service answered
            kind = (429 if code.startswith("Throttling") else
                    403 if code.startswith(("InvalidAccessKey", "SignatureDoesNotMatch", "Forbidden")) else status)
            answered = f"HTTP {status} " if status else ""
            raise http_error(kind, f"{shown}: {answered}{code or type(exc).__name__}: {text}",
                             f"{shown} refused the AccessKey (HTTP {status} {code}: {text}); check accessKeyId / "
                             "accessKeySecret or the PAI-DLC credentials block, and the RAM user's PAI-DLC "
                             "permissions") from None

    def check_platform(self) -> None:
        self.check_receiver_reachable()
        _, _, models = _sdk()
        self._call("list_jobs", lambda: self.api.list_jobs(models.ListJobsRequest(
            page_size=1, workspace_id=self.config.workspace_id)))

    # ---- what the shared-storage base asks ------------------------------------------------------

    def make_storage(self) -> MountedShare:
        return MountedShare(self.config.local_storage_mount_point, self.config.container_storage_mount_point,
                             f"NAS data source {self.config.nas_data_source_id}")

    def roles(self) -> dict[str, str]:
        return {self.config.type: self.config.trial_command}

    def job_name(self, kind: str, ident: str) -> str:
        return f"nni_exp_{self.experiment_id}_{kind}_{ident}"

    def create_request(self, name: str, command: list[str], token_ref: str) -> Any:
        """NNI's CreateJobRequest for job ``name`` running ``command``."""
        _, _, models = _sdk()
        config = self.config
        sources = [models.CreateJobRequestDataSources(data_source_id=config.nas_data_source_id,
                                                      mount_path=config.container_storage_mount_point)]
        if config.oss_data_source_id:
            sources.append(models.CreateJobRequestDataSources(data_source_id=config.oss_data_source_id))
        spot = None if config.spot_discount_limit is None else models.SpotSpec(
            spot_strategy="SpotWithPriceLimit", spot_discount_limit=config.spot_discount_limit)
        spec = models.JobSpec(type=config.type, image=config.image, pod_count=config.pod_count,
                              ecs_spec=config.ecs_spec, spot_spec=spot, use_spot_instance=spot is not None or None)
        return models.CreateJobRequest(display_name=name, job_type=config.job_type, job_specs=[spec],
                                       user_command=self.shell_command(command, token_ref), data_sources=sources,
                                       workspace_id=config.workspace_id)

    def find_jobs(self, name: str) -> list[tuple[str, str]]:
        _, _, models = _sdk()
        found = self._call("list_jobs", lambda: self.api.list_jobs(models.ListJobsRequest(
            display_name=name, workspace_id=self.config.workspace_id, page_size=100)))
        return [(str(j.job_id), str(j.gmt_create_time or "")) for j in (found.body.jobs or [])
                if j.display_name == name]

    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        if self.job_id(name) is not None:
            return  # an earlier attempt created it although its answer was lost
        request = self.create_request(name, commands[self.config.type], token_ref)
        created = self._call("create_job", lambda: self.api.create_job(request))
        self.remember_job_id(name, str(created.body.job_id))

    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        job_id = self.job_id(name)
        if job_id is None:
            return None
        _, _, models = _sdk()
        try:
            job = self._call("get_job", lambda: self.api.get_job(job_id, models.GetJobRequest())).body
        except PlatformError as exc:
            if "NotFound" in str(exc) or "HTTP 404" in str(exc):
                return None
            raise
        why = ": ".join(str(p) for p in (job.reason_code, job.reason_message) if p)
        used = str(job.restart_times or "").split("/")[0]  # "<restarts used>/<most allowed>"
        restarted = job.status == "Restarting" or (used.isdigit() and int(used) > 0)
        self.note_restart(name, f"restarted {used or 'once'}: {why or 'no reason given'}" if restarted else None)
        evicted = [str(pod.pod_id) for pod in job.pods or [] if pod.sub_status == "Evicted"]
        self.note_interruption(name, f"PAI-DLC evicted pod {', '.join(evicted)} of job {name}" +
                               (f" ({why})" if why else "") if evicted else None)
        return self.outcome(name, str(job.status or ""), STATES, why)

    def sole_primary(self) -> bool:
        return self.config.pod_count == 1

    def delete_job(self, name: str) -> None:
        job_id = self.job_id(name)
        if job_id is not None:
            try:
                self._call("stop_job", lambda: self.api.stop_job(job_id))
            except PlatformError as exc:  # gone, or already ended: nothing left to stop
                if isinstance(exc, TransientPlatformError):
                    raise
        self.forget_state(name)


PLATFORM = Platform(DlcConfig, DLCTrainingService, PAIDLCCredentials, "dlc")
