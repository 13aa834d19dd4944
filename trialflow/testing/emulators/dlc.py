"""An Alibaba Cloud PAI-DLC API emulator for tests: real HTTP on 127.0.0.1, spoken to by the official
SDK (``alibabacloud-pai-dlc20201203``) with ``Config(endpoint="127.0.0.1:<port>", protocol="http")``.

Every request must carry a valid ACS3-HMAC-SHA256 signature: the emulator rebuilds the canonical
request (method, path, sorted query, the signed headers, the body's SHA-256) and checks the HMAC with
the secret of the AccessKey named in ``Credential=`` (an unknown key: 404
``InvalidAccessKeyId.NotFound``; a bad signature: 400 ``SignatureDoesNotMatch``). Errors are JSON
``{Code, Message, RequestId}`` as the real API's. The ROA paths answered, with PascalCase JSON:

- ``POST /api/v1/jobs`` (CreateJob): DisplayName, JobType (TFJob, PyTorchJob, ...), JobSpecs (Type,
  Image, PodCount >= 1, EcsSpec or ResourceConfig) and UserCommand are required (400
  ``InvalidParameter`` naming the field); DataSources must name known data sources. ``{JobId, RequestId}``.
- ``GET /api/v1/jobs/{JobId}`` (GetJob): the job with Status, ReasonCode/Message, Pods, Gmt* times.
- ``GET /api/v1/jobs`` (ListJobs): filtered by DisplayName, WorkspaceId and Status.
- ``POST /api/v1/jobs/{JobId}/stop`` (StopJob).

Jobs move through Creating, Queuing, EnvPreparing, Running, then Succeeded / Failed (any pod failing
fails the job; the others are stopped), or Stopping, Stopped. Each pod runs UserCommand as a local
process with every data source's MountPath mapped to its local folder (``data_sources``). Knobs:
:meth:`DLCEmulator.stop_by_platform`, :meth:`DLCEmulator.evict` (the pods ``SubStatus: Evicted``, the
job Failed), :meth:`DLCEmulator.restart` (``Restarting``, the pods started again under their names,
``RestartTimes``) and :mod:`.http_server`'s faults (throttling with Retry-After).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from .http_server import EmulatorServer, Request
from .processes import ContainerProcess

JOB_TYPES = ("TFJob", "PyTorchJob", "MPIJob", "XGBoostJob", "OneFlowJob", "ElasticBatchJob", "SlurmJob", "RayJob",
             "DataJuicerJob")
WAITING = ("Creating", "Queuing", "EnvPreparing")
ENDED = ("Succeeded", "Failed", "Stopped")
MAX_RESTARTS = 3


def _iso(moment: float | None) -> str | None:
    return None if moment is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


class DlcError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class DlcJob:
    id: str
    body: dict[str, Any]
    status: str = "Creating"
    created: float = field(default_factory=time.time)
    running: float | None = None
    finished: float | None = None
    reason_code: str = ""
    reason_message: str = ""
    pods: list[tuple[str, ContainerProcess]] = field(default_factory=list)
    stop_by: str | None = None
    evicted: set[str] = field(default_factory=set)  # pods the platform evicted
    restarts: int = 0
    busy: bool = False  # an eviction or restart is under way: the scheduler leaves the job alone


def acs3_signature_error(request: Request, secrets: dict[str, str]) -> DlcError | None:
    """Why the request's ACS3-HMAC-SHA256 signature is not valid (None when it is)."""
    auth = request.headers.get("Authorization") or ""
    if not auth.startswith("ACS3-HMAC-SHA256 "):
        return DlcError(400, "MissingAuthorization", "the request is not signed with ACS3-HMAC-SHA256")
    parts = dict(p.split("=", 1) for p in auth[len("ACS3-HMAC-SHA256 "):].split(",") if "=" in p)
    secret = secrets.get(parts.get("Credential", ""))
    if secret is None:
        return DlcError(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
    payload = hashlib.sha256(request.body).hexdigest()
    if request.headers.get("x-acs-content-sha256") != payload:
        return DlcError(400, "SignatureDoesNotMatch", "x-acs-content-sha256 does not match the body")
    query = "&".join(f"{k}={quote(v[0], safe='~')}" for k, v in sorted(request.query.items()))
    signed = parts.get("SignedHeaders", "")
    headers = "".join(f"{name}:{(request.headers.get(name) or '').strip()}\n" for name in signed.split(";"))
    canonical = f"{request.method}\n{request.path}\n{query}\n{headers}\n{signed}\n{payload}"
    to_sign = f"ACS3-HMAC-SHA256\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    expected = hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts.get("Signature", "")):
        return DlcError(400, "SignatureDoesNotMatch", "The request signature does not conform to Aliyun standards.")
    return None


class DLCEmulator(EmulatorServer):
    """See the module docstring. ``access_keys`` maps AccessKey ids to secrets; ``data_sources`` maps
    data source ids to the local folders they hold."""

    name = "dlc-emulator"

    def __init__(self, directory: Path, access_keys: dict[str, str], data_sources: dict[str, Path],
                 kill_grace: float = 1.0) -> None:
        self.directory = Path(directory)
        super().__init__()
        self.access_keys = dict(access_keys)
        self.data_sources = {k: Path(v) for k, v in data_sources.items()}
        self.kill_grace = kill_grace
        self.jobs: dict[str, DlcJob] = {}
        self.lock = threading.RLock()

    def on_stop(self) -> None:
        for job in list(self.jobs.values()):
            for _, process in job.pods:
                process.kill(self.kill_grace)

    # ---- test access ----------------------------------------------------------------------

    def named(self, display_name: str) -> list[DlcJob]:
        with self.lock:
            return [j for j in self.jobs.values() if j.body.get("DisplayName") == display_name]

    def stop_by_platform(self, job_id: str) -> None:
        """Stop a job as the platform would (a quota, an operator)."""
        with self.lock:
            job = self.jobs[job_id]
            if job.status not in ENDED:
                job.status, job.stop_by = "Stopping", "the platform"

    def evict(self, job_id: str, reason: str = "the spot instance was reclaimed") -> None:
        """Evict every pod of a running job as PAI-DLC does when their instance goes (a reclaimed spot
        instance): SIGTERM, SIGKILL after the grace period, the pods Failed with ``SubStatus: Evicted``
        and the job Failed."""
        job = self._claim_running(job_id)
        for _, process in job.pods:
            process.kill(self.kill_grace)
        with self.lock:
            job.evicted.update(name for name, _ in job.pods)
            job.status, job.finished, job.busy = "Failed", time.time(), False
            job.reason_code, job.reason_message = "JobFailed", f"pods evicted: {reason}"

    def restart(self, job_id: str, reason: str = "node failure") -> None:
        """Restart a running job's pods in place as PAI-DLC's fault tolerance does: ``Restarting``, the
        pods killed and started again under the same names, then ``Running``; ``RestartTimes`` counts."""
        job = self._claim_running(job_id)
        with self.lock:
            job.status, job.reason_code, job.reason_message = "Restarting", "JobRestarting", reason
        for _, process in job.pods:
            process.kill(self.kill_grace)
        with self.lock:
            job.pods, job.restarts = [], job.restarts + 1
        self._launch(job)
        with self.lock:
            job.busy = False

    def _claim_running(self, job_id: str) -> DlcJob:
        with self.lock:
            job = self.jobs[job_id]
            assert job.status == "Running" and not job.busy, f"job {job_id} is {job.status}"
            job.busy = True
            return job

    # ---- the HTTP side --------------------------------------------------------------------

    def fault_body(self, status: int) -> Any:
        code = "Throttling.User" if status == 429 else "InternalError"
        return {"Code": code, "Message": "injected fault", "RequestId": str(uuid.uuid4())}

    def respond(self, request: Request) -> tuple[int, Any]:
        try:
            problem = acs3_signature_error(request, self.access_keys)
            if problem is not None:
                raise problem
            return 200, {**self._route(request), "RequestId": str(uuid.uuid4())}
        except DlcError as exc:
            return exc.status, {"Code": exc.code, "Message": exc.message, "RequestId": str(uuid.uuid4())}

    def _route(self, request: Request) -> dict[str, Any]:
        parts = [unquote(p) for p in request.path.strip("/").split("/")]
        if parts[:3] != ["api", "v1", "jobs"]:
            raise DlcError(404, "InvalidAction.NotFound", f"no API at {request.method} {request.path}")
        if len(parts) == 3 and request.method == "POST":
            return self._create(request.json() or {})
        if len(parts) == 3 and request.method == "GET":
            query = {k: v[0] for k, v in request.query.items()}
            with self.lock:
                jobs = [self.record(j) for j in self.jobs.values()
                        if all(j.body.get(k) == query[k] for k in ("DisplayName", "WorkspaceId") if query.get(k))
                        and (not query.get("Status") or j.status == query["Status"])]
            size = int(query.get("PageSize") or 10)
            return {"Jobs": jobs[:size], "TotalCount": len(jobs)}
        job = self.jobs.get(parts[3]) if len(parts) >= 4 else None
        if job is None:
            raise DlcError(404, "EntityNotExist.Job", f"job {parts[3] if len(parts) > 3 else ''} does not exist")
        if len(parts) == 4 and request.method == "GET":
            return self.record(job)
        if parts[4:] == ["stop"] and request.method == "POST":
            with self.lock:
                if job.status not in ENDED:
                    job.status, job.stop_by = "Stopping", "its owner"
            return {"JobId": job.id}
        raise DlcError(404, "InvalidAction.NotFound", f"no API at {request.method} {request.path}")

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        for key in ("DisplayName", "JobType", "JobSpecs", "UserCommand"):
            if not body.get(key):
                raise DlcError(400, "InvalidParameter", f"{key} is mandatory for this action.")
        if body["JobType"] not in JOB_TYPES:
            raise DlcError(400, "InvalidParameter.JobType", f"JobType {body['JobType']!r} is not supported")
        for spec in body["JobSpecs"]:
            if not spec.get("Image") or int(spec.get("PodCount") or 0) < 1:
                raise DlcError(400, "InvalidParameter.JobSpecs", "each job spec needs Image and PodCount >= 1")
            if not spec.get("EcsSpec") and not spec.get("ResourceConfig"):
                raise DlcError(400, "InvalidParameter.JobSpecs", "each job spec needs EcsSpec or ResourceConfig")
        for source in body.get("DataSources") or []:
            if source.get("DataSourceId") not in self.data_sources:
                raise DlcError(400, "InvalidParameter.DataSource", f"data source {source.get('DataSourceId')} "
                                                                   "does not exist")
        job = DlcJob(f"dlc{uuid.uuid4().hex[:14]}", body)
        with self.lock:
            self.jobs[job.id] = job
        return {"JobId": job.id}

    def record(self, job: DlcJob) -> dict[str, Any]:
        pods = [{"PodId": name, "Type": job.body["JobSpecs"][0].get("Type", "Worker"),
                 "Status": "Running" if p.exit_code is None else "Succeeded" if p.exit_code == 0 else "Failed",
                 "SubStatus": "Evicted" if name in job.evicted else "Normal"}
                for name, p in job.pods]
        return {"JobId": job.id, "DisplayName": job.body.get("DisplayName"), "JobType": job.body.get("JobType"),
                "Status": job.status, "ReasonCode": job.reason_code, "ReasonMessage": job.reason_message,
                "GmtCreateTime": _iso(job.created), "GmtRunningTime": _iso(job.running),
                "GmtFinishTime": _iso(job.finished), "WorkspaceId": job.body.get("WorkspaceId"),
                "JobSpecs": job.body.get("JobSpecs"), "UserCommand": job.body.get("UserCommand"), "Pods": pods,
                "RestartTimes": f"{job.restarts}/{MAX_RESTARTS}"}

    # ---- the scheduler --------------------------------------------------------------------

    def tick(self) -> None:
        with self.lock:
            jobs = [j for j in self.jobs.values() if j.status not in ENDED]
        for job in jobs:
            self._advance(job)

    def _advance(self, job: DlcJob) -> None:
        with self.lock:
            if job.busy:
                return
        if job.status == "Stopping":
            for _, process in job.pods:
                process.kill(self.kill_grace)
            job.status, job.finished = "Stopped", time.time()
            job.reason_code, job.reason_message = "JobStopped", f"stopped by {job.stop_by}"
        elif job.status in WAITING[:-1]:
            job.status = WAITING[WAITING.index(job.status) + 1]
        elif job.status == "EnvPreparing":
            self._launch(job)
        elif job.status == "Running":
            codes = [p.exit_code for _, p in job.pods]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or None not in codes:
                with self.lock:
                    if job.busy:  # the pods ended by an eviction or restart begun meanwhile
                        return
                    job.status = "Failed" if failed else "Succeeded"
                    job.reason_code = "JobFailed" if failed else "JobSucceeded"
                    job.reason_message = f"a pod exited with code {failed[0]}" if failed else ""
                    job.finished = time.time()
                for _, process in job.pods:
                    process.kill(self.kill_grace)

    def _launch(self, job: DlcJob) -> None:
        mounts = [(str(s["MountPath"]), str(self.data_sources[s["DataSourceId"]]))
                  for s in job.body.get("DataSources") or [] if s.get("MountPath")]
        for spec in job.body["JobSpecs"]:
            for index in range(int(spec["PodCount"])):
                name = f"{job.id}-{str(spec.get('Type', 'worker')).lower()}-{index}"
                env = {**{str(k): str(v) for k, v in (job.body.get("Envs") or {}).items()}, "JOB_ID": job.id}
                process = ContainerProcess([job.body["UserCommand"]], mounts, env,
                                           self.directory / "jobs" / f"{name}.log", name)
                process.start()
                job.pods.append((name, process))
        job.status, job.running = "Running", time.time()
