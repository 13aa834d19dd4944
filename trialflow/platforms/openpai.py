"""OpenPAI training service over the REST server's v2 API (docs/platforms.md#openpai, docs/nni.md#platform-requests),
with ``requests`` (:mod:`.rest_api`).

The host may be the cluster's web portal (pylon, which serves the API under ``/rest-server``) or the
REST server itself: ``prepare`` asks ``/rest-server/api/v2/info`` then ``/api/v2/info`` and keeps the
one that answers. Every call carries ``Authorization: Bearer <token>``; ``prepare`` reads the user
(401/403 there is a clear credentials error before any trial) and checks that the storage config and
the virtual cluster are the user's.

A trial (or, with ``reuseMode: true``, the default as in NNI, an environment) is one job submitted as
a v2 job protocol (``POST /api/v2/jobs``, ``text/yaml``) named ``nni_exp_<exp>_trial_<trial>``
(``..._env_<env>``). NNI's protocol: one dockerimage prerequisite, role ``taskrole`` with
trialCpuNumber / trialMemorySize / trialGpuNumber, ``extras.storages`` naming storageConfigName,
``defaults.virtualCluster``. With ``openpaiConfig`` / ``openpaiConfigFile`` the user's protocol is the
base: its name is replaced, the first task role runs the trial (its ``commands`` replaced) and the
other roles keep their own commands, as NNI did. A 409 on submit means the job exists (a retried
submit), never a second job. Status is ``GET /api/v2/jobs/{user}~{job}``; cancel is ``PUT
.../executionType {"value": "STOP"}``. Code, runtime, trial files and metrics tokens live on the
storage (``localStorageMountPoint`` here, ``containerStorageMountPoint`` in the jobs).

State table (``jobStatus.state``, docs/platforms.md#job-states):

=====================  ====================================================
WAITING                WAITING
RUNNING                RUNNING
SUCCEEDED              SUCCEEDED
FAILED                 FAILED
STOPPING, STOPPED      USER_CANCELED / EARLY_STOPPED when trialflow stopped it,
                       otherwise SYS_CANCELED
UNKNOWN (or new)       the previous state, logged
=====================  ====================================================

Interruptions (docs/platforms.md#interruptions): OpenPAI runs a job again by itself after a platform
failure (its exit spec's PLATFORM_FAILURE / TRANSIENT codes: a pod preempted for other work, evicted,
on a lost node), counted in ``retryDetails.platform``. The replica run again finds the trial claimed
and runs nothing; trialflow stops the job and runs the trial again as a new job. A job that ended by
such a failure without a retry is one too. ``jobPriorityClass: oppo`` asks the hived scheduler for
idle capacity that other jobs preempt.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from ..blocks import OpenPAICredentials, load_block
from ..config.sections.openpai import OpenpaiConfig
from .base import PlatformError, TrialStatus
from .mounted_share import MountedShare
from .platform_row import Platform
from .rest_api import RestApi, reveal
from .rest_jobs import RestJobService

IMAGE_PREREQUISITE = "docker_image_0"
DEFAULT_ROLE = "taskrole"
STATES = {
    "WAITING": TrialStatus.WAITING,
    "RUNNING": TrialStatus.RUNNING,
    "SUCCEEDED": TrialStatus.SUCCEEDED,
    "FAILED": TrialStatus.FAILED,
    "STOPPING": TrialStatus.SYS_CANCELED,
    "STOPPED": TrialStatus.SYS_CANCELED,
}  # UNKNOWN and any other state: the previous one


def openpai_state(detail: dict[str, Any]) -> tuple[str, str | None]:
    """A JobDetail's state and, for a failed or stopped job, the message that says why."""
    status = detail.get("jobStatus") or {}
    state = str(status.get("state") or "UNKNOWN")
    if state == "FAILED":
        return state, (f"OpenPAI job {detail.get('name')} failed (exit code {status.get('appExitCode')}"
                       + (f": {status['appExitDiagnostics']}" if status.get("appExitDiagnostics") else "") + ")")
    if state in ("STOPPING", "STOPPED"):
        return state, f"OpenPAI job {detail.get('name')} was stopped outside trialflow ({state})"
    return state, None


def platform_retry(detail: dict[str, Any]) -> str | None:
    """The REST server's word that the platform ran the job again (``retryDetails.platform``: attempts
    that ended by a platform failure, such as a preempted or evicted pod or a lost node, and that do
    not count toward ``jobRetryCount``); None when it did not."""
    status = detail.get("jobStatus") or {}
    retries = (status.get("retryDetails") or {}).get("platform") or 0
    if not isinstance(retries, int) or retries <= 0:
        return None
    return f"{retries} platform retr{'y' if retries == 1 else 'ies'}, now attempt {status.get('attemptId')}"


def platform_failure(detail: dict[str, Any]) -> str | None:
    """The exit spec of a job that ended by a transient platform failure (a preempted or evicted pod,
    a lost node: ``appExitSpec`` type PLATFORM_FAILURE, behavior TRANSIENT), in its words; None
    otherwise."""
    status = detail.get("jobStatus") or {}
    spec = status.get("appExitSpec") or {}
    if spec.get("type") != "PLATFORM_FAILURE" or spec.get("behavior") != "TRANSIENT":
        return None
    return f"OpenPAI job {detail.get('name')} ended by {spec.get('phrase')} (exit code {spec.get('code')}: " \
        f"{spec.get('reason')})"


class OpenPAITrainingService(RestJobService[OpenpaiConfig]):
    platform = "openpai"
    label = "OpenPAI"

    def __init__(self, config: OpenpaiConfig, experiment_dir: Path) -> None:
        super().__init__(config, experiment_dir)
        self.username, self._api_token, self.host, self._verify = self._login()

    def _login(self) -> tuple[str, str, str, bool | str]:
        config = self.config
        username, token, host = config.username, config.token, config.host
        verify: bool | str = str(config.ca_bundle) if config.ca_bundle else config.verify_tls
        if config.credentials:
            block = load_block(OpenPAICredentials, config.credentials)
            username, token = block.username, block.token
            host = (block.host or host).rstrip("/")
            if not block.verify_tls:
                verify = False
            elif block.ca_bundle:
                verify = block.ca_bundle
        assert username and token is not None  # the config's rule
        return username, reveal(token, "token", "OpenPAI credentials"), host if "://" in host else f"https://{host}", \
            verify

    # ---- the REST server ------------------------------------------------------------------------

    def connect(self) -> RestApi:
        """The API under whichever base answers: the portal's ``/rest-server`` or the host itself."""
        hint = (f"check username and token for {self.host} (OpenPAI web portal > Profile > Tokens, or the "
                "OpenPAI credentials block named by 'credentials')")
        seen = []
        for base in (f"{self.host}/rest-server", self.host):
            probe = RestApi(base, f"the OpenPAI REST server at {base}", hint, verify=self._verify,
                            headers={"Authorization": f"Bearer {self._api_token}"}, secrets=[self._api_token])
            response = probe.call("GET", "api/v2/info", ok=(200,), absent=range(300, 500))
            try:
                info = response.json() if response is not None else None
            except ValueError:
                info = None
            if isinstance(info, dict) and "name" in info:
                return probe
            probe.close()
            seen.append(f"{base}/api/v2/info")
        raise PlatformError(f"no OpenPAI REST server answers at {self.host} (tried {' and '.join(seen)}); set host "
                            "to the cluster's web portal or its REST server")

    def platform_address(self) -> str:
        return self.host

    def check_platform(self) -> None:
        self.check_receiver_reachable()
        user = self.api.call("GET", f"api/v2/users/{quote(self.username)}")
        assert user is not None
        info = user.json()
        clusters = info.get("virtualCluster") or []
        if self.config.virtual_cluster and clusters and self.config.virtual_cluster not in clusters:
            raise PlatformError(f"virtualCluster {self.config.virtual_cluster!r} is not a virtual cluster of user "
                                f"{self.username!r} on {self.host}; available: {', '.join(clusters)}")
        storages = self.api.call("GET", "api/v2/storages")
        assert storages is not None
        names = [s.get("name") for s in storages.json().get("storages") or []]
        if self.config.storage_config_name not in names:
            raise PlatformError(f"storageConfigName {self.config.storage_config_name!r} is not a storage of user "
                                f"{self.username!r} on {self.host}; available: {', '.join(map(str, names)) or 'none'}")

    # ---- what the shared-storage base asks ------------------------------------------------------

    def make_storage(self) -> MountedShare:
        return MountedShare(self.config.local_storage_mount_point, self.config.container_storage_mount_point,
                             f"OpenPAI storage {self.config.storage_config_name!r}")

    def roles(self) -> dict[str, str]:
        template = self.config.protocol_template()
        if not template or not template.get("taskRoles"):
            return {DEFAULT_ROLE: self.config.trial_command}
        roles = {}
        for i, (name, role) in enumerate(template["taskRoles"].items()):
            roles[name] = self.config.trial_command if i == 0 else "\n".join(role.get("commands") or [])
        return roles

    def job_name(self, kind: str, ident: str) -> str:
        return f"nni_exp_{self.experiment_id}_{kind}_{ident}"

    def protocol(self, name: str, commands: dict[str, list[str]], token_ref: str) -> dict[str, Any]:
        """The v2 job protocol of job ``name`` (see the module docstring)."""
        config = self.config
        template = copy.deepcopy(config.protocol_template() or {})
        lines = {role: [self.shell_command(command, token_ref)] for role, command in commands.items()}
        if not template.get("taskRoles"):
            template.update({
                "prerequisites": [{"type": "dockerimage", "uri": config.docker_image, "name": IMAGE_PREREQUISITE}],
                "taskRoles": {DEFAULT_ROLE: {
                    "instances": 1, "completion": {"minFailedInstances": 1, "minSucceededInstances": -1},
                    "taskRetryCount": 0, "dockerImage": IMAGE_PREREQUISITE,
                    "resourcePerInstance": {"gpu": config.trial_gpu_number or 0, "cpu": config.trial_cpu_number,
                                            "memoryMB": config.trial_memory_size},
                    "commands": []}},
            })
        protocol = {"protocolVersion": 2, "type": "job", "jobRetryCount": 0, **template, "name": name}
        roles = protocol["taskRoles"]
        for role in list(roles):
            if role in lines:
                roles[role]["commands"] = lines[role]
            else:  # a reuse environment runs the primary role only
                del roles[role]
        extras = protocol.setdefault("extras", {})
        storages = extras.setdefault("storages", [])
        if not any(s.get("name") == config.storage_config_name for s in storages):
            storages.append({"name": config.storage_config_name})
        extras.setdefault("submitFrom", "submit-job-v2")
        if config.job_priority_class:
            extras.setdefault("hivedScheduler", {})["jobPriorityClass"] = config.job_priority_class
        if config.virtual_cluster:
            protocol.setdefault("defaults", {})["virtualCluster"] = config.virtual_cluster
        return protocol

    def _job_path(self, name: str) -> str:
        return f"api/v2/jobs/{quote(self.username)}~{quote(name)}"

    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        body = yaml.safe_dump(self.protocol(name, commands, token_ref), sort_keys=False)
        # 409: the job exists -- an earlier attempt of this submit went through although its answer was lost
        self.api.call("POST", "api/v2/jobs", ok=(200, 201, 202), absent=(409,), data=body.encode(),
                      headers={"Content-Type": "text/yaml"})

    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        response = self.api.call("GET", self._job_path(name), absent=(404,))
        if response is None:
            return None
        detail = response.json()
        state, message = openpai_state(detail)
        self.note_restart(name, platform_retry(detail))
        self.note_interruption(name, platform_failure(detail))
        return self.apply_states(name, state, STATES), message

    def delete_job(self, name: str) -> None:
        self.api.call("PUT", f"{self._job_path(name)}/executionType", ok=(200, 202), absent=(404,),
                      json={"value": "STOP"})
        self.forget_state(name)


PLATFORM = Platform(OpenpaiConfig, OpenPAITrainingService, OpenPAICredentials)
