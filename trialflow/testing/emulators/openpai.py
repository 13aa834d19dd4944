"""An OpenPAI REST server emulator for tests: real HTTP (or HTTPS with a self-signed certificate) on
127.0.0.1, spoken to with ``requests`` exactly as a real cluster.

It serves what trialflow's OpenPAI service uses, with the shapes of the swagger (v2.2.7):
``GET /api/v2/info``, ``GET /api/v2/users/{user}``, ``GET /api/v2/storages``, ``POST /api/v2/jobs``
(``text/yaml``; every protocol validated by :func:`.platform_specs.openpai_protocol_errors`, a bad one
refused with 400 InvalidProtocolError; an unknown virtual cluster with 400 NoVirtualClusterError, a
storage that is not the user's with 403; a name the user already has with 409 ConflictJobError),
``GET /api/v2/jobs?username=``, ``GET /api/v2/jobs/{user}~{job}`` (JobDetail), ``.../config`` and ``PUT
.../executionType``. Every call but ``info`` needs ``Authorization: Bearer <token>`` of a known user
(401 UnauthorizedUserError otherwise). ``front_end="pylon"`` answers under ``/rest-server`` only (and
``/api/...`` with the web portal's HTML, as pylon does); ``"rest-server"`` answers at the root only.

Jobs. Each instance of each task role runs its ``commands`` (one ``sh -e`` script) as a local process,
with every ``extras.storages`` entry mounted at its ``mountPath`` (default ``/mnt/<name>``) mapped to
the storage's local folder. States follow the REST server: WAITING (AttemptCreationPending, then
AttemptPreparing), RUNNING (AttemptRunning), then Completed as SUCCEEDED / FAILED by each role's
``completion`` (minFailedInstances default 1, -1 never; minSucceededInstances default all instances;
a job whose tasks all ended without a trigger succeeds), remaining tasks killed. ``executionType: STOP``
(or :meth:`OpenPAIEmulator.stop_job`, a stop by someone else) goes through STOPPING to STOPPED with
exit code -210. :meth:`OpenPAIEmulator.preempt` ends an attempt by a platform failure, retried as a
new attempt when the exit spec says so (``retries``, ``retryDetails.platform``, ``attemptId``); every
job status carries the exit spec of its code (``appExitSpec``).

Fault knobs and lifecycle are :mod:`.http_server`'s; ``stop()`` also kills every job process.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import yaml

from .http_server import EmulatorServer, Request
from .platform_specs import openpai_protocol_errors
from .processes import ContainerProcess

STOP_CODE = -210
# Entries of OpenPAI's job exit spec (src/k8s-job-exit-spec/config/k8s-job-exit-spec.yaml): code ->
# (phrase, type, behavior, reaction, reason). Codes not listed take the fallback of their sign.
EXIT_SPECS = {
    0: ("Succeeded", "USER_SUCCESS", "UNKNOWN", "NEVER_RETRY", "User program exits with exitcode 0"),
    -210: ("StopFrameworkRequested", "USER_STOP", "PERMANENT", "NEVER_RETRY", "User has requested to stop the job"),
    -1000: ("PodEvicted", "PLATFORM_FAILURE", "TRANSIENT", "ALWAYS_RETRY",
            "Pod is evicted by K8S, maybe its node is out of resource"),
    -1001: ("PodNodeLost", "PLATFORM_FAILURE", "TRANSIENT", "ALWAYS_RETRY",
            "Pod lost due to node lost, maybe its kubelet is down for a long time"),
    -1003: ("PodPreemptedForCriticalPod", "PLATFORM_FAILURE", "TRANSIENT", "ALWAYS_RETRY",
            "Pod is preempted by the kubelet of its node for the admission of other more critical platform Pod"),
    143: ("ContainerSigTermReceived", "PLATFORM_FAILURE", "TRANSIENT", "ALWAYS_RETRY",
          "Container killed by OS Signal: SIGTERM"),
    256: ("PAIRuntimeExitAbnormally", "PLATFORM_FAILURE", "UNKNOWN", "RETRY_TO_MAX",
          "PAI Runtime exit abnormally with undefined exitcode, it may have bugs"),
    -8000: ("ContainerUndefinedNegativeExitCode", "UNKNOWN_FAILURE", "UNKNOWN", "RETRY_TO_MAX",
            "Container exited with undefined negative exitcode"),
}


def exit_spec(code: int | None) -> dict[str, Any] | None:
    """The exit spec the REST server gives exit code ``code`` (its sign's fallback for codes not listed)."""
    if code is None:
        return None
    phrase, kind, behavior, reaction, reason = EXIT_SPECS.get(code) or EXIT_SPECS[256 if code > 0 else -8000]
    return {"code": code, "phrase": phrase, "issuer": "PAI_FC", "causer": kind, "type": kind, "stage": "RUNNING",
            "behavior": behavior, "reaction": reaction, "reason": reason, "repro": []}
PORTAL_PAGE = "<!DOCTYPE html><html><head><title>OpenPAI</title></head><body>web portal</body></html>"


def _ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Task:
    role: str
    index: int
    process: ContainerProcess
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class Job:
    user: str
    name: str
    protocol: dict[str, Any]
    text: str
    virtual_cluster: str
    submitted: int = field(default_factory=_ms)
    state: str = "WAITING"
    sub_state: str = "AttemptCreationPending"
    execution_type: str = "START"
    exit_code: int | None = None
    diagnostics: str = ""
    launched: int | None = None
    completed: int | None = None
    tasks: list[Task] = field(default_factory=list)
    stop_by: str | None = None
    attempt: int = 0
    platform_retries: int = 0
    preempting: bool = False


class PaiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class OpenPAIEmulator(EmulatorServer):
    """See the module docstring. ``users`` maps user names to tokens; ``storages`` maps storage
    config names to local folders (every user may use every storage); ``startup`` seconds pass in
    WAITING before a job's tasks start."""

    name = "openpai-emulator"

    def __init__(self, directory: Path, users: dict[str, str], storages: dict[str, Path],
                 virtual_clusters: tuple[str, ...] = ("default",), front_end: str = "pylon", tls: bool = False,
                 kill_grace: float = 1.0, startup: float = 0.0) -> None:
        self.directory = Path(directory)
        super().__init__(self.directory / "tls" if tls else None)
        self.users = dict(users)
        self.storages = {name: Path(path) for name, path in storages.items()}
        self.virtual_clusters = tuple(virtual_clusters)
        self.front_end = front_end
        self.kill_grace = kill_grace
        self.startup = startup
        self.jobs: dict[tuple[str, str], Job] = {}
        self.submitted: list[dict[str, Any]] = []  # every accepted protocol, in order
        self.lock = threading.RLock()

    # ---- lifecycle and test access --------------------------------------------------------

    def on_stop(self) -> None:
        with self.lock:
            jobs = list(self.jobs.values())
        for job in jobs:
            for task in job.tasks:
                task.process.kill(self.kill_grace)

    def job(self, name: str, user: str | None = None) -> Job | None:
        with self.lock:
            for (owner, job_name), job in self.jobs.items():
                if job_name == name and user in (None, owner):
                    return job
        return None

    def stop_job(self, name: str) -> None:
        """Stop a job as someone other than trialflow would (an admin, a quota)."""
        job = self.job(name)
        assert job is not None, f"no job {name}"
        with self.lock:
            job.execution_type, job.stop_by = "STOP", "admin"

    def preempt(self, name: str, code: int = -1003, retry: bool = True) -> None:
        """End the running attempt of job ``name`` by a platform failure ``code`` (default: its pods
        preempted for other work): its tasks get SIGTERM, then SIGKILL after the grace period. A
        transient platform failure is retried as FrameworkController's fancy retry policy does: a new
        attempt, counted in ``retryDetails.platform``; any other, or any with ``retry=False`` (a
        framework without that policy and no retries left), ends the job FAILED."""
        job = self.job(name)
        assert job is not None and job.tasks, f"no running job {name}"
        with self.lock:
            job.preempting = True
        for task in job.tasks:
            task.process.kill(self.kill_grace)
        spec = exit_spec(code) or {}
        retried = retry and spec.get("reaction") == "ALWAYS_RETRY"
        if not retried:
            self._complete(job, "FAILED", code, f"{spec.get('phrase')}: {spec.get('reason')}")
        with self.lock:
            if retried:
                job.attempt, job.platform_retries, job.tasks = job.attempt + 1, job.platform_retries + 1, []
                job.state, job.sub_state, job.launched = "WAITING", "AttemptCreationPending", None
            job.preempting = False

    # ---- the HTTP side --------------------------------------------------------------------

    def fault_body(self, status: int) -> Any:
        return {"code": "UnknownError", "message": "injected fault: the server is currently unable to handle it"}

    def respond(self, request: Request) -> tuple[int, Any]:
        path = request.path
        if self.front_end == "pylon":
            if not path.startswith("/rest-server/"):
                return 200, PORTAL_PAGE  # pylon serves the web portal for everything else
            path = path[len("/rest-server"):]
        try:
            return self._route(request, path)
        except PaiError as exc:
            return exc.status, {"code": exc.code, "message": exc.message}

    def _user(self, request: Request) -> str:
        header = request.headers.get("Authorization") or ""
        if header.startswith("Bearer "):
            for user, token in self.users.items():
                if header[len("Bearer "):] == token:
                    return user
        raise PaiError(401, "UnauthorizedUserError", "Guest is not allowed to do this operation.")

    def _route(self, request: Request, path: str) -> tuple[int, Any]:
        method = request.method
        if path == "/api/v2/info" and method == "GET":
            return 200, {"name": "PAI RESTful API", "version": "v1.8.0", "launcherType": "k8s",
                         "authnMethod": "basic"}
        if not path.startswith("/api/v2/"):
            raise PaiError(404, "NoApiError", f"The API {path} could not be found.")
        user = self._user(request)
        parts = path[len("/api/v2/"):].rstrip("/").split("/")
        if parts[0] == "users" and len(parts) == 2 and method == "GET":
            name = unquote(parts[1])
            if name != user:
                raise PaiError(403, "ForbiddenUserError", "Non-admin is not allow to do this operation.")
            return 200, {"username": user, "admin": False, "virtualCluster": list(self.virtual_clusters),
                         "storageConfig": list(self.storages), "email": f"{user}@example.org", "extension": {}}
        if parts == ["storages"] and method == "GET":
            return 200, {"storages": [{"name": n, "share": True, "volumeName": f"{n}-pv", "default": False}
                                      for n in self.storages]}
        if parts == ["jobs"] and method == "POST":
            return self._submit(user, request)
        if parts == ["jobs"] and method == "GET":
            owner = (request.query.get("username") or [""])[0] or None
            with self.lock:
                return 200, [self._summary(j) for j in self.jobs.values() if owner in (None, j.user)]
        if parts[0] == "jobs" and len(parts) >= 2 and "~" in parts[1]:
            owner, name = (unquote(p) for p in parts[1].split("~", 1))
            with self.lock:
                job = self.jobs.get((owner, name))
            if job is None:
                raise PaiError(404, "NoJobError", f"Job {parts[1]} is not found.")
            if len(parts) == 2 and method == "GET":
                return 200, self.detail(job)
            if parts[2:] == ["config"] and method == "GET":
                return 200, job.text
            if parts[2:] == ["executionType"] and method == "PUT":
                return self._execution_type(user, job, request)
        raise PaiError(404, "NoApiError", f"The API {method} {path} could not be found.")

    def _submit(self, user: str, request: Request) -> tuple[int, Any]:
        if not (request.headers.get("Content-Type") or "").startswith("text/"):
            raise PaiError(400, "InvalidProtocolError", "the job protocol must be sent as text/yaml")
        try:
            protocol = yaml.safe_load(request.body.decode())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise PaiError(400, "InvalidProtocolError", f"the job protocol is not YAML: {exc}") from None
        problems = openpai_protocol_errors(protocol)
        if problems:
            raise PaiError(400, "InvalidProtocolError", "; ".join(problems))
        vc = str((protocol.get("defaults") or {}).get("virtualCluster") or "default")
        if vc not in self.virtual_clusters:
            raise PaiError(400, "NoVirtualClusterError", f"Virtual cluster {vc} is not found.")
        for storage in (protocol.get("extras") or {}).get("storages") or []:
            if storage.get("name") not in self.storages:
                raise PaiError(403, "ForbiddenUserError", f"User {user} is not allowed to use storage "
                                                          f"{storage.get('name')}.")
        name = str(protocol["name"])
        with self.lock:
            if (user, name) in self.jobs:
                raise PaiError(409, "ConflictJobError", f"Job name {name} already exists.")
            self.jobs[(user, name)] = Job(user, name, protocol, request.body.decode(), vc)
            self.submitted.append(protocol)
        return 202, {"status": 202, "message": f"Update job {name} for user {user} successfully."}

    def _execution_type(self, user: str, job: Job, request: Request) -> tuple[int, Any]:
        if job.user != user:
            raise PaiError(403, "ForbiddenUserError", f"User {user} is not allowed to do operation to {job.name}")
        value = (request.json() or {}).get("value")
        if value not in ("START", "STOP"):
            raise PaiError(400, "InvalidParametersError", "value must be START or STOP")
        with self.lock:
            if value == "STOP" and job.completed is None:
                job.execution_type, job.stop_by = "STOP", user
        return 202, {"message": f"Execute job {job.name} successfully."}

    # ---- JobDetail ------------------------------------------------------------------------

    def _status(self, job: Job) -> dict[str, Any]:
        return {"username": job.user, "state": job.state, "subState": job.sub_state,
                "executionType": job.execution_type, "retries": job.platform_retries,
                "retryDetails": {"user": 0, "platform": job.platform_retries, "resource": 0}, "retryDelayTime": None,
                "submissionTime": job.submitted, "createdTime": job.submitted, "launchedTime": job.launched,
                "completedTime": job.completed, "attemptId": job.attempt, "attemptState": job.state,
                "appId": f"{job.user}~{job.name}", "appCreatedTime": job.submitted, "appLaunchedTime": job.launched,
                "appCompletedTime": job.completed, "appExitCode": job.exit_code,
                "appExitSpec": exit_spec(job.exit_code),
                "appExitDiagnostics": job.diagnostics or None, "virtualCluster": job.virtual_cluster}

    def _summary(self, job: Job) -> dict[str, Any]:
        status = self._status(job)
        return {"name": job.name, "tags": [], **{k: status[k] for k in (
            "username", "state", "subState", "executionType", "retries", "retryDetails", "retryDelayTime",
            "submissionTime", "createdTime", "launchedTime", "completedTime", "appExitCode", "virtualCluster")}}

    def detail(self, job: Job) -> dict[str, Any]:
        with self.lock:
            roles: dict[str, Any] = {}
            for role in job.protocol["taskRoles"]:
                statuses = []
                for task in (t for t in job.tasks if t.role == role):
                    code = task.process.exit_code
                    state = ("RUNNING" if code is None else "SUCCEEDED" if code == 0 else
                             "STOPPED" if task.process.killed else "FAILED")
                    statuses.append({"taskIndex": task.index, "taskUid": task.uid, "taskState": state,
                                     "attemptId": job.attempt, "attemptState": state, "containerExitCode": code})
                roles[role] = {"taskRoleStatus": {"name": role}, "taskStatuses": statuses}
            return {"name": job.name, "tags": [], "jobStatus": self._status(job), "taskRoles": roles}

    # ---- the launcher ---------------------------------------------------------------------

    def tick(self) -> None:
        with self.lock:
            jobs = [j for j in self.jobs.values() if j.completed is None]
        for job in jobs:
            try:
                self._advance(job)
            except Exception as exc:  # noqa: BLE001 -- one job's failure must not stop the others
                self._complete(job, "FAILED", 1, f"emulator: {exc}")

    def _advance(self, job: Job) -> None:
        with self.lock:
            if job.preempting:
                return
            attempt = job.attempt  # a preemption meanwhile makes what this call saw stale
        if job.execution_type == "STOP":
            with self.lock:
                job.state, job.sub_state = "STOPPING", "AttemptDeletionPending"
            for task in job.tasks:
                task.process.kill(self.kill_grace)
            self._complete(job, "STOPPED", STOP_CODE, f"stopped by {job.stop_by}", attempt)
            return
        if not job.tasks:
            job.sub_state = "AttemptPreparing"
            if time.time() * 1000 - job.submitted >= self.startup * 1000:
                self._launch(job)
            return
        roles = job.protocol["taskRoles"]
        ended_all = True
        for name, role in roles.items():
            codes = [t.process.exit_code for t in job.tasks if t.role == name]
            failed = [c for c in codes if c not in (None, 0)]
            succeeded = sum(1 for c in codes if c == 0)
            completion = role.get("completion") or {}
            min_failed = int(completion.get("minFailedInstances", 1))
            min_succeeded = int(completion.get("minSucceededInstances", len(codes)))
            if min_failed != -1 and len(failed) >= min_failed:
                self._complete(job, "FAILED", failed[0], f"task role {name}: {len(failed)} task(s) failed", attempt)
                return
            if min_succeeded != -1 and succeeded >= min_succeeded:
                self._complete(job, "SUCCEEDED", 0, "", attempt)
                return
            ended_all = ended_all and None not in codes
        if ended_all:
            self._complete(job, "SUCCEEDED", 0, "", attempt)

    def _launch(self, job: Job) -> None:
        mounts = []
        for storage in (job.protocol.get("extras") or {}).get("storages") or []:
            local = self.storages[storage["name"]]
            mounts.append((str(storage.get("mountPath") or f"/mnt/{storage['name']}"), str(local)))
        for name, role in job.protocol["taskRoles"].items():
            for index in range(int(role.get("instances", 1))):
                hostname = f"{job.name}-{name}-{index}".lower().replace("_", "-")
                env = {"PAI_JOB_NAME": f"{job.user}~{job.name}", "PAI_USER_NAME": job.user,
                       "PAI_CURRENT_TASK_ROLE_NAME": name, "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(index),
                       "PAI_TASK_INDEX": str(index)}
                log = self.directory / "jobs" / f"{job.user}~{job.name}" / f"{name}-{index}.log"
                task = Task(name, index, ContainerProcess(list(role["commands"]), mounts, env, log, hostname))
                task.process.start()
                job.tasks.append(task)
        with self.lock:
            job.state, job.sub_state, job.launched = "RUNNING", "AttemptRunning", _ms()

    def _complete(self, job: Job, state: str, code: int, diagnostics: str, attempt: int | None = None) -> None:
        """End job ``job``; ``attempt``: only if that attempt is still the job's, not being preempted."""
        with self.lock:
            if attempt is not None and (job.preempting or job.attempt != attempt):
                return
        for task in job.tasks:
            if task.process.exit_code is None:
                task.process.kill(self.kill_grace)
        with self.lock:
            job.state, job.sub_state, job.exit_code = state, "Completed", code
            job.diagnostics, job.completed = diagnostics, _ms()
