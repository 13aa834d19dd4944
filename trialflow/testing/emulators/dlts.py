"""A DLTS (DLWorkspace) dashboard emulator for tests: real HTTP on 127.0.0.1, spoken to with
``requests`` as a real dashboard.

It serves what trialflow's DLTS service uses. Every call authenticates with the query string
(``email`` and ``password``, or ``token``); a wrong one is answered 403. Routes:

- ``GET /api/teams/{team}/clusters/{cluster}``: the team's cluster record, ``metadata`` a JSON string
  whose keys are the GPU types;
- ``POST /api/clusters/{cluster}/jobs``: the body is checked with the dashboard's ``job.schema.json``
  (400 with the validator's message) and then as the backend does: an empty ``jobName`` or ``vcName``,
  an unknown team or GPU type is an HTTP 200 ``{"error": "Cannot create job!..."}``; otherwise
  ``{"jobId": <uuid>}`` (names are not unique, as on a real cluster);
- ``GET /api/v2/clusters/{cluster}/jobs/{id}`` and ``GET /api/v2/clusters/{cluster}/teams/{team}/jobs``
  (the user's jobs of that team): job records ``{jobId, jobName, userName, vcName, jobStatus,
  jobStatusDetail, jobType, jobTime, jobParams}``;
- ``PUT /api/clusters/{cluster}/jobs/{id}/status``: the body checked with ``status.schema.json``;
  ``killing`` kills the job (killing, then killed), ``pausing`` pauses it, ``queued`` resumes it.

Jobs go queued, scheduling, running, then finished (exit 0) or failed. The ``cmd`` runs as a local
process with the work directory mount (``work_mount``: container path, local folder) mapped. Test
knobs: :meth:`DLTSEmulator.kill_job` (a kill by someone else), :meth:`DLTSEmulator.pause_job`, and
:mod:`.http_server`'s faults. ``stop()`` kills every job process.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .http_server import EmulatorServer, Request
from .platform_specs import dlts_body_errors
from .processes import ContainerProcess


def _iso(moment: float | None) -> str | None:
    return None if moment is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


@dataclass
class DltsJob:
    id: str
    params: dict[str, Any]
    cluster: str
    status: str = "queued"
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    message: str = ""
    process: ContainerProcess | None = None
    wanted: str | None = None  # a status change asked for: killing, pausing, queued


class DLTSEmulator(EmulatorServer):
    """See the module docstring. ``users`` maps e-mails to passwords; ``teams`` maps each team to its
    clusters and their GPU types."""

    name = "dlts-emulator"

    def __init__(self, directory: Path, users: dict[str, str], teams: dict[str, dict[str, list[str]]],
                 work_mount: tuple[str, Path], kill_grace: float = 1.0) -> None:
        self.directory = Path(directory)
        super().__init__()
        self.users = dict(users)
        self.teams = {t: dict(c) for t, c in teams.items()}
        self.work_mount = (work_mount[0], str(work_mount[1]))
        self.kill_grace = kill_grace
        self.jobs: dict[str, DltsJob] = {}
        self.lock = threading.RLock()

    def on_stop(self) -> None:
        for job in list(self.jobs.values()):
            if job.process is not None:
                job.process.kill(self.kill_grace)

    # ---- test knobs -----------------------------------------------------------------------

    def named(self, name: str) -> list[DltsJob]:
        with self.lock:
            return [j for j in self.jobs.values() if j.params.get("jobName") == name]

    def kill_job(self, job_id: str) -> None:
        """Kill a job as someone other than trialflow would (an admin, a quota)."""
        with self.lock:
            self.jobs[job_id].wanted = "killing"

    def pause_job(self, job_id: str) -> None:
        with self.lock:
            self.jobs[job_id].wanted = "pausing"

    # ---- the HTTP side --------------------------------------------------------------------

    def fault_body(self, status: int) -> Any:
        return {"message": "injected fault: the dashboard is currently unable to handle the request"}

    def respond(self, request: Request) -> tuple[int, Any]:
        email = (request.query.get("email") or [""])[0]
        secret = (request.query.get("password") or request.query.get("token") or [""])[0]
        if not email or self.users.get(email) != secret:
            return 403, "Forbidden"
        parts = [unquote(p) for p in request.path.strip("/").split("/")]
        method = request.method
        try:
            body = request.json()
        except ValueError:
            return 400, {"message": "the body is not JSON"}
        if parts[:2] == ["api", "teams"] and len(parts) == 5 and parts[3] == "clusters" and method == "GET":
            team, cluster = parts[2], parts[4]
            if cluster not in self.teams.get(team, {}):
                return 404, {"message": f"team {team} has no cluster {cluster}"}
            gpus = {kind: {"num_gpu_per_node": 4} for kind in self.teams[team][cluster]}
            return 200, {"clusterId": cluster, "teamId": team, "metadata": json.dumps(gpus), "quota": "{}"}
        if parts[:2] == ["api", "clusters"] and len(parts) == 4 and parts[3] == "jobs" and method == "POST":
            return self._submit(parts[2], email, body)
        if parts[:3] == ["api", "v2", "clusters"] and len(parts) == 6 and parts[4] == "jobs" and method == "GET":
            job = self.jobs.get(parts[5])
            if job is None or job.cluster != parts[3]:
                return 404, {"message": f"job {parts[5]} not found"}
            return 200, self.record(job)
        if (parts[:3] == ["api", "v2", "clusters"] and len(parts) == 7 and parts[4] == "teams"
                and parts[6] == "jobs" and method == "GET"):
            with self.lock:
                return 200, [self.record(j) for j in self.jobs.values() if j.cluster == parts[3]
                             and j.params.get("vcName") == parts[5] and j.params.get("userName") == email]
        if (parts[:2] == ["api", "clusters"] and len(parts) == 6 and parts[3] == "jobs" and parts[5] == "status"
                and method == "PUT"):
            problems = dlts_body_errors("status", body)
            if problems:
                return 400, {"message": "; ".join(problems)}
            job = self.jobs.get(parts[4])
            if job is None:
                return 404, {"message": f"job {parts[4]} not found"}
            with self.lock:
                job.wanted = body["status"]
            return 200, {"message": f"job {job.id} status will be {body['status']}"}
        return 404, {"message": f"no route {method} {request.path}"}

    def _submit(self, cluster: str, email: str, body: Any) -> tuple[int, Any]:
        problems = dlts_body_errors("job", body)
        if problems:
            return 400, {"message": "; ".join(problems)}
        params = {**body, "userName": email, "familyToken": str(uuid.uuid4()), "isParent": 1}
        team = str(params["team"])
        if not params.get("jobName") or not params.get("vcName"):
            return 200, {"error": "Cannot create job!jobName and vcName must not be empty"}
        if cluster not in self.teams.get(team, {}):
            return 200, {"error": f"Cannot create job!team {team} has no cluster {cluster}"}
        if params.get("resourcegpu") and params.get("gpuType") not in self.teams[team][cluster]:
            return 200, {"error": f"Cannot create job!no GPU type {params.get('gpuType')!r} in {cluster}"}
        if not isinstance(params.get("cmd"), str) or not params["cmd"].strip():
            return 200, {"error": "Cannot create job!cmd is empty"}
        job = DltsJob(str(uuid.uuid4()), params, cluster)
        with self.lock:
            self.jobs[job.id] = job
        return 200, {"jobId": job.id}

    def record(self, job: DltsJob) -> dict[str, Any]:
        detail = {"startedAt": _iso(job.started), "finishedAt": _iso(job.finished), "message": job.message or None}
        return {"jobId": job.id, "jobName": job.params.get("jobName"), "userName": job.params.get("userName"),
                "vcName": job.params.get("vcName"), "jobStatus": job.status, "jobStatusDetail": [detail],
                "jobType": job.params.get("jobType"), "jobTime": _iso(job.created), "jobParams": job.params}

    # ---- the scheduler --------------------------------------------------------------------

    def tick(self) -> None:
        with self.lock:
            jobs = [j for j in self.jobs.values() if j.status not in ("finished", "failed", "killed", "error")]
        for job in jobs:
            self._advance(job)

    def _advance(self, job: DltsJob) -> None:
        wanted, job.wanted = job.wanted, None
        if wanted == "killing":
            job.status = "killing"
            if job.process is not None:
                job.process.kill(self.kill_grace)
            job.status, job.finished = "killed", time.time()
            return
        if wanted == "pausing" and job.status in ("queued", "scheduling", "running"):
            if job.process is not None:
                job.process.kill(self.kill_grace)
            job.status = "paused"
            return
        if wanted == "queued" and job.status == "paused":
            job.status, job.process = "queued", None
            return
        if job.status == "queued":
            job.status = "scheduling"
        elif job.status == "scheduling":
            log = self.directory / "jobs" / f"{job.id}.log"
            job.process = ContainerProcess([job.params["cmd"]], [self.work_mount],
                                           {e["name"]: os.path.expandvars(str(e["value"]))
                                            for e in job.params.get("env") or []
                                            if isinstance(e, dict) and "name" in e},
                                           log, f"dlts-{job.id[:8]}")
            job.process.start()
            job.status, job.started = "running", time.time()
        elif job.status == "running" and job.process is not None:
            code = job.process.exit_code
            if code is not None:
                job.status = "finished" if code == 0 else "failed"
                job.message = "" if code == 0 else f"exit code {code}"
                job.finished = time.time()
