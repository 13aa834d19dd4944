"""DLTS (Deep Learning Training Service, DLWorkspace) training service over the dashboard's REST API
(docs/platforms.md#dlts, docs/nni.md#platform-requests), with ``requests`` (:mod:`.rest_api`).

Every call authenticates with the query string ``?email=<email>&password=<password>`` as the
dashboard expects; the password is scrubbed from every message and from urllib3's debug log lines.
``prepare`` reads the team's cluster record (``GET api/teams/{team}/clusters/{cluster}``): a 403 there
is a clear credentials error before any trial, and the GPU type is taken from it when ``gpuType`` is
not set (the first key of its ``metadata``, as NNI did).

A trial (or reuse environment) is one job, ``POST api/clusters/{cluster}/jobs`` with NNI's body
(``jobName`` ``nni_exp_<exp>_trial_<trial>``, resourcegpu, image, cmd, team/vcName, userName, gpuType
and NNI's fixed fields). An HTTP 200 with ``{"error": ...}`` is a refusal, not a job. DLTS job names
are not unique, so a submit first looks the name up among the team's jobs (``GET
api/v2/clusters/{cluster}/teams/{team}/jobs``): a retried submit whose first answer was lost finds
its job instead of creating a second one. Status is ``GET api/v2/clusters/{cluster}/jobs/{id}``; cancel
is ``PUT api/clusters/{cluster}/jobs/{id}/status {"status": "killing"}``. Code, runtime, trial files
and metrics tokens live on the cluster's shared work directory (``localStorageMountPoint`` here,
``containerStorageMountPoint`` in jobs).

State table (``jobStatus``, docs/platforms.md#job-states):

==============================  ===================================================
unapproved, queued, scheduling  WAITING
running                         RUNNING
pausing, paused                 RUNNING, and trialflow kills the job (as NNI did: a
                                paused trial would hold its slot forever); an
                                interruption: the trial runs again as a new job
finished                        SUCCEEDED
failed, error                   FAILED
killing, killed                 USER_CANCELED / EARLY_STOPPED when trialflow killed it,
                                otherwise SYS_CANCELED
(anything else)                 the previous state, logged
==============================  ===================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..blocks import DLTSCredentials, load_block
from ..config.sections.dlts import DltsConfig
from .base import PlatformError, TrialStatus
from .mounted_share import MountedShare
from .platform_row import Platform
from .rest_api import RestApi, reveal
from .rest_jobs import RestJobService

ROLE = "trial"
STATES = {
    "unapproved": TrialStatus.WAITING, "queued": TrialStatus.WAITING, "scheduling": TrialStatus.WAITING,
    "running": TrialStatus.RUNNING, "pausing": TrialStatus.RUNNING, "paused": TrialStatus.RUNNING,
    "finished": TrialStatus.SUCCEEDED, "failed": TrialStatus.FAILED, "error": TrialStatus.FAILED,
    "killing": TrialStatus.SYS_CANCELED, "killed": TrialStatus.SYS_CANCELED,
}  # any other state: the previous one
PAUSED = ("pausing", "paused")
FIXED_FIELDS: dict[str, Any] = {
    "jobType": "training", "jobtrainingtype": "RegularJob", "ssh": False, "ipython": False, "tensorboard": False,
    "workPath": "", "enableworkpath": True, "dataPath": "", "enabledatapath": False, "jobPath": "",
    "enablejobpath": True, "mountpoints": [], "env": [{"name": "TMPDIR", "value": "$HOME/tmp"}],
    "hostNetwork": False, "useGPUTopology": False, "isPrivileged": False, "hostIPC": False,
    "preemptionAllowed": "False", "interactivePorts": [],
}


def dlts_state(job: dict[str, Any]) -> tuple[str, str | None]:
    """A job record's state and, for a failed, killed or paused job, the message that says why."""
    state = str(job.get("jobStatus") or "")
    details = job.get("jobStatusDetail")
    detail = details[0] if isinstance(details, list) and details and isinstance(details[0], dict) else {}
    reason = detail.get("message") or detail.get("reason")
    if STATES.get(state) == TrialStatus.FAILED:
        return state, f"DLTS job {job.get('jobName')} {state}" + (f": {reason}" if reason else "")
    if STATES.get(state) == TrialStatus.SYS_CANCELED:
        return state, f"DLTS job {job.get('jobName')} was killed outside trialflow ({state})"
    if state in PAUSED:
        return state, f"DLTS job {job.get('jobName')} was {state} by the cluster; trialflow kills it"
    return state, None


class DLTSTrainingService(RestJobService[DltsConfig]):
    platform = "dlts"
    label = "DLTS"

    def __init__(self, config: DltsConfig, experiment_dir: Path) -> None:
        self._gpu_type = config.gpu_type
        super().__init__(config, experiment_dir)
        self.email, self._password, self.team = self._login()

    def _login(self) -> tuple[str, str, str]:
        config = self.config
        email, password, team = config.email, config.password, config.team
        if config.credentials:
            block = load_block(DLTSCredentials, config.credentials)
            email, password, team = block.email, block.password, block.team or team
        assert email and password is not None  # the config's rule
        if not team:
            raise PlatformError("the DLTS team is not set: set team (your virtual cluster) in the config or the "
                                "credentials block, or $DLWS_VC_NAME")
        return email, reveal(password, "password", "DLTS credentials"), team

    def connect(self) -> RestApi:
        config = self.config
        verify: bool | str = str(config.ca_bundle) if config.ca_bundle else config.verify_tls
        return RestApi(config.dashboard, f"the DLTS dashboard at {config.dashboard}",
                       f"check email and password for {config.dashboard} (the config, $DLWS_USER_EMAIL / "
                       "$DLTS_JOB_TOKEN, or the DLTS credentials block named by 'credentials')",
                       verify=verify, params={"email": self.email, "password": self._password},
                       secrets=[self._password])

    def platform_address(self) -> str:
        return str(self.config.dashboard)

    def _cluster(self) -> str:
        return quote(self.config.cluster, safe="")

    def check_platform(self) -> None:
        self.check_receiver_reachable()
        response = self.api.call("GET", f"api/teams/{quote(self.team)}/clusters/{self._cluster()}", absent=(404,))
        if response is None:
            raise PlatformError(f"team {self.team!r} has no cluster {self.config.cluster!r} on "
                                f"{self.config.dashboard}; check team and cluster")
        if self._gpu_type is None:
            metadata = response.json().get("metadata") or "{}"
            try:
                kinds = list(json.loads(metadata) if isinstance(metadata, str) else metadata)
            except ValueError:
                kinds = []
            self._gpu_type = kinds[0] if kinds else ""
            if not kinds and self.config.trial_gpu_number:
                raise PlatformError(f"cluster {self.config.cluster!r} of team {self.team!r} lists no GPU type; "
                                    "set gpuType")

    # ---- what the shared-storage base asks ------------------------------------------------------

    def make_storage(self) -> MountedShare:
        return MountedShare(self.config.local_storage_mount_point, str(self.config.container_storage_mount_point),
                             "the DLTS work directory")

    def roles(self) -> dict[str, str]:
        return {ROLE: self.config.trial_command}

    def job_name(self, kind: str, ident: str) -> str:
        return f"nni_exp_{self.experiment_id}_{kind}_{ident}"

    def job_body(self, name: str, command: list[str], token_ref: str) -> dict[str, Any]:
        """NNI's DLTS job body for ``name`` running ``command``."""
        config = self.config
        return {"jobName": name, "resourcegpu": config.trial_gpu_number or 0, "image": config.image,
                "cmd": self.shell_command(command, token_ref), "team": self.team, "vcName": self.team,
                "userName": self.email, "gpuType": self._gpu_type or "", **FIXED_FIELDS,
                "preemptionAllowed": str(config.preemptible)}

    def find_jobs(self, name: str) -> list[tuple[str, str]]:
        response = self.api.call("GET", f"api/v2/clusters/{self._cluster()}/teams/{quote(self.team)}/jobs",
                                 params={"user": self.email, "limit": 1000}, absent=(404,))
        jobs = response.json() if response is not None else []
        return [(str(j["jobId"]), str(j.get("jobTime") or "")) for j in jobs
                if isinstance(j, dict) and j.get("jobName") == name]

    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        if self.job_id(name) is not None:
            return  # an earlier attempt created it although its answer was lost
        response = self.api.call("POST", f"api/clusters/{self._cluster()}/jobs", ok=(200, 201),
                                 json=self.job_body(name, commands[ROLE], token_ref))
        assert response is not None
        answer = response.json()
        if not isinstance(answer, dict) or answer.get("error") or not answer.get("jobId"):
            error = answer.get("error") if isinstance(answer, dict) else answer
            raise PlatformError(f"the DLTS dashboard at {self.config.dashboard} refused job {name}: {error}")
        self.remember_job_id(name, str(answer["jobId"]))

    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        job_id = self.job_id(name)
        if job_id is None:
            return None
        response = self.api.call("GET", f"api/v2/clusters/{self._cluster()}/jobs/{quote(job_id)}", absent=(404,))
        if response is None:
            return None
        state, message = dlts_state(response.json())
        if state in PAUSED:  # an interruption
            self.note_interruption(name, str(message))
            self._kill(job_id)
        return self.apply_states(name, state, STATES), message

    def _kill(self, job_id: str) -> None:
        self.api.call("PUT", f"api/clusters/{self._cluster()}/jobs/{quote(job_id)}/status", ok=(200, 201, 202),
                      absent=(404,), json={"status": "killing"})

    def delete_job(self, name: str) -> None:
        job_id = self.job_id(name)
        if job_id is not None:
            self._kill(job_id)
        self.forget_state(name)


PLATFORM = Platform(DltsConfig, DLTSTrainingService, DLTSCredentials)
