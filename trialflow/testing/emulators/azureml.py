"""An Azure ML workspace emulator for tests: real HTTPS on 127.0.0.1, spoken to by the supported SDK
``azure-ai-ml`` through its developer endpoint override (``AZUREML_DEV_URL_MFE``), with a real
azure-identity credential: ``ManagedIdentityCredential`` fetches its token from the emulator's
managed identity endpoint (``IDENTITY_ENDPOINT`` / ``IDENTITY_HEADER``, the App Service protocol), and
every workspace call must carry that token (401 otherwise). :meth:`AzureMLEmulator.client_env` gives
the variables.

Routes under ``/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/
workspaces/{ws}`` (the api-version, which differs per call, is ignored): ``PUT environments/{name}/
versions/{v}`` (an image is required), ``PUT jobs/{name}`` (a Command job: command, a known
``computeId`` and a registered ``environmentId`` are required, 400 ``UserError`` otherwise; an
existing name is 409), ``GET jobs/{name}`` (the job echoed with ``properties.status``; 404 when
unknown) and ``POST jobs/{name}/cancel`` (202). Errors are ``{"error": {"code", "message"}}``.

Jobs move NotStarted, Queued, Preparing, Running, Finalizing, then Completed or Failed; a cancel goes
CancelRequested, Canceled. The command runs as a local process with each ``uri_folder`` input of an
``azureml://datastores/<name>/paths/<path>`` URI mounted (``${{inputs.<key>}}`` replaced by its mount
path, mapped to the datastore's local folder), on a node of its compute that ``POST
computes/{name}/listNodes`` lists (AmlComputeNodeInformation: nodeState running, then idle). Knobs:
:meth:`AzureMLEmulator.cancel_by_platform`, :meth:`AzureMLEmulator.preempt` (the node ``preempted``,
the job queued again or Failed) and :mod:`.http_server`'s faults.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .http_server import EmulatorServer, Request
from .processes import ContainerProcess

STEPS = ("NotStarted", "Queued", "Preparing")
ENDED = ("Completed", "Failed", "Canceled")


class AmlError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class AmlJob:
    name: str
    body: dict[str, Any]
    status: str = "NotStarted"
    preempting: bool = False
    node: str | None = None
    process: ContainerProcess | None = None
    cancel_by: str | None = None
    created: float = field(default_factory=time.time)


class AzureMLEmulator(EmulatorServer):
    """See the module docstring. ``datastores`` maps datastore names to local folders."""

    name = "azureml-emulator"

    def __init__(self, directory: Path, datastores: dict[str, Path], computes: tuple[str, ...] = ("cpu-cluster",),
                 subscription: str = "sub-0001", resource_group: str = "rg-nni", workspace: str = "ws-nni",
                 kill_grace: float = 1.0) -> None:
        self.directory = Path(directory)
        super().__init__(self.directory / "tls")  # HTTPS, as Azure's: the SDK sends tokens over nothing else
        self.datastores = {k: Path(v) for k, v in datastores.items()}
        self.computes = tuple(computes)
        self.subscription, self.resource_group, self.workspace = subscription, resource_group, workspace
        self.kill_grace = kill_grace
        self.token = f"aml-token-{secrets.token_hex(8)}"
        self.identity_header = secrets.token_hex(12)
        self.jobs: dict[str, AmlJob] = {}
        self.environments: set[str] = set()
        self.nodes: dict[str, dict[str, Any]] = {}  # node id -> AmlComputeNodeInformation, with its compute
        self.lock = threading.RLock()

    @property
    def prefix(self) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers/"
                f"Microsoft.MachineLearningServices/workspaces/{self.workspace}")

    def client_env(self) -> dict[str, str]:
        """What a client process needs: the SDK's endpoint override, the managed identity endpoint and
        the emulator's certificate to trust (``REQUESTS_CA_BUNDLE``, which the SDK's transport reads)."""
        return {"AZUREML_DEV_URL_MFE": self.url, "IDENTITY_ENDPOINT": f"{self.url}/msi/token",
                "IDENTITY_HEADER": self.identity_header, "REQUESTS_CA_BUNDLE": str(self.certificate)}

    def on_stop(self) -> None:
        for job in list(self.jobs.values()):
            if job.process is not None:
                job.process.kill(self.kill_grace)

    def cancel_by_platform(self, name: str) -> None:
        """Cancel a job as someone other than trialflow would (a workspace admin, a quota)."""
        with self.lock:
            job = self.jobs[name]
            if job.status not in ENDED:
                job.status, job.cancel_by = "CancelRequested", "the workspace"

    def preempt(self, name: str, requeue: bool = True) -> None:
        """Preempt the low-priority node under running job ``name``: the job's process gets SIGTERM,
        SIGKILL after the grace period, the node's state is ``preempted``; the job is queued again
        (then prepared and run on another node) or, with ``requeue=False``, Failed."""
        with self.lock:
            job = self.jobs[name]
            assert job.status == "Running" and job.process is not None and not job.preempting, job.status
            job.preempting = True
        job.process.kill(self.kill_grace)
        with self.lock:
            self.nodes[str(job.node)]["nodeState"] = "preempted"
            job.status, job.preempting = ("Queued" if requeue else "Failed"), False
            if requeue:
                job.process = None

    # ---- the HTTP side --------------------------------------------------------------------

    def fault_body(self, status: int) -> Any:
        return {"error": {"code": "ServiceError" if status != 429 else "TooManyRequests",
                          "message": "injected fault"}}

    def respond(self, request: Request) -> tuple[int, Any]:
        try:
            if request.path == "/msi/token":
                return 200, self._issue_token(request)
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise AmlError(401, "AuthenticationFailed", "the access token is missing, invalid or expired")
            return self._route(request)
        except AmlError as exc:
            return exc.status, {"error": {"code": exc.code, "message": exc.message}}

    def _issue_token(self, request: Request) -> dict[str, Any]:
        if request.headers.get("X-IDENTITY-HEADER") != self.identity_header:
            raise AmlError(401, "Unauthorized", "X-IDENTITY-HEADER is missing or wrong")
        resource = (request.query.get("resource") or [""])[0]
        return {"access_token": self.token, "expires_on": str(int(time.time()) + 3600), "resource": resource,
                "token_type": "Bearer"}

    def _route(self, request: Request) -> tuple[int, Any]:
        if not request.path.startswith(self.prefix + "/"):
            raise AmlError(404, "WorkspaceNotFound", f"no workspace at {request.path}")
        parts = [unquote(p) for p in request.path[len(self.prefix) + 1:].split("/")]
        body = request.json() or {}
        if parts[0] == "environments" and len(parts) == 4 and request.method == "PUT":
            if not (body.get("properties") or {}).get("image"):
                raise AmlError(400, "UserError", "an environment needs an image")
            env_id = f"{self.prefix}/environments/{parts[1]}/versions/{parts[3]}"
            self.environments.add(env_id)
            return 200, {"id": env_id, "name": parts[3], "type": "Microsoft.MachineLearningServices/workspaces/"
                         "environments/versions", "properties": body.get("properties")}
        if parts[0] == "computes" and parts[2:] == ["listNodes"] and request.method == "POST":
            if parts[1] not in self.computes:
                raise AmlError(404, "ResourceNotFound", f"compute {parts[1]} was not found")
            with self.lock:
                nodes = [{k: v for k, v in n.items() if k != "compute"} for n in self.nodes.values()
                         if n["compute"] == parts[1]]
            return 200, {"nodes": nodes, "nextLink": None}
        if parts[0] == "jobs" and len(parts) >= 2:
            name = parts[1]
            if len(parts) == 2 and request.method == "PUT":
                return 201, self._create(name, body)
            with self.lock:
                job = self.jobs.get(name)
            if job is None:
                raise AmlError(404, "UserError", f"job {name} was not found in workspace {self.workspace}")
            if len(parts) == 2 and request.method == "GET":
                return 200, self.record(job)
            if parts[2:] == ["cancel"] and request.method == "POST":
                with self.lock:
                    if job.status not in ENDED:
                        job.status, job.cancel_by = "CancelRequested", "its owner"
                return 202, ""
        raise AmlError(404, "NotFound", f"no API at {request.method} {request.path}")

    def _create(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        props = body.get("properties") or {}
        if props.get("jobType") != "Command":
            raise AmlError(400, "UserError", f"jobType {props.get('jobType')!r} is not supported here (Command)")
        if not str(props.get("command") or "").strip():
            raise AmlError(400, "UserError", "a command job needs a command")
        compute = str(props.get("computeId") or "").rsplit("/", 1)[-1]
        if compute not in self.computes:
            raise AmlError(400, "UserError", f"compute {compute!r} was not found in workspace {self.workspace}")
        if props.get("environmentId") not in self.environments:
            raise AmlError(400, "UserError", f"environment {props.get('environmentId')!r} is not registered")
        for key, item in (props.get("inputs") or {}).items():
            store = str(item.get("uri") or "").removeprefix("azureml://datastores/").split("/", 1)[0]
            if store not in self.datastores:
                raise AmlError(400, "UserError", f"input {key}: datastore {store!r} was not found")
        with self.lock:
            if name in self.jobs:
                raise AmlError(409, "UserError", f"a job named {name} already exists")
            self.jobs[name] = AmlJob(name, body)
            return self.record(self.jobs[name])

    def record(self, job: AmlJob) -> dict[str, Any]:
        return {"id": f"{self.prefix}/jobs/{job.name}", "name": job.name,
                "type": "Microsoft.MachineLearningServices/workspaces/jobs",
                "properties": {**(job.body.get("properties") or {}), "status": job.status}}

    # ---- the scheduler --------------------------------------------------------------------

    def tick(self) -> None:
        with self.lock:
            jobs = [j for j in self.jobs.values() if j.status not in ENDED]
        for job in jobs:
            with self.lock:
                if job.preempting:
                    continue
            if job.status == "CancelRequested":
                if job.process is not None:
                    job.process.kill(self.kill_grace)
                job.status = "Canceled"
                if job.node is not None:
                    self.nodes[job.node].update(nodeState="idle", runId=None)
            elif job.status in STEPS:
                index = STEPS.index(job.status)
                if index + 1 < len(STEPS):
                    job.status = STEPS[index + 1]
                else:
                    self._launch(job)
            elif job.status == "Running" and job.process is not None and job.process.exit_code is not None:
                job.status = "Finalizing"
            elif job.status == "Finalizing" and job.process is not None:
                with self.lock:
                    job.status = "Completed" if job.process.exit_code == 0 else "Failed"
                    self.nodes[str(job.node)].update(nodeState="idle", runId=None)

    def _launch(self, job: AmlJob) -> None:
        props = job.body["properties"]
        command, mounts = str(props["command"]), []
        for key, item in (props.get("inputs") or {}).items():
            store, _, path = str(item["uri"]).removeprefix("azureml://datastores/").partition("/paths/")
            mount = f"/mnt/azureml/cr/j/{uuid.uuid5(uuid.NAMESPACE_URL, job.name).hex}/cap/data-capability/wd/{key}"
            command = command.replace(f"${{{{inputs.{key}}}}}", mount)
            mounts.append((mount, str(self.datastores[store] / path.strip("/"))))
        env = {"AZUREML_RUN_ID": job.name, **{str(k): str(v) for k, v in (props.get("environmentVariables") or {})
                                               .items()}}
        job.process = ContainerProcess([command], mounts, env, self.directory / "jobs" / f"{job.name}.log",
                                       f"aml-{job.name[-12:]}")
        job.process.start()
        with self.lock:
            job.node = f"tvmps_{uuid.uuid4().hex[:16]}_p"
            compute = str(props.get("computeId") or "").rsplit("/", 1)[-1]
            self.nodes[job.node] = {"nodeId": job.node, "privateIpAddress": "10.0.0.4", "publicIpAddress": None,
                                    "port": 50000, "nodeState": "running", "runId": job.name, "compute": compute}
            job.status = "Running"
