"""Any Prefect work pool as a training platform (``platform: prefect``): each trial, or reuse
environment, is a flow run of trialflow's trial-runner flow (``trialflow.flows.trial_runner``) on the
pool, so every pool a team already runs -- process, Docker, Kubernetes, ECS, Cloud Run, ACI, Vertex
AI -- runs trials without platform code of its own.

This is the one platform that speaks to Prefect's API (the client of the controller's Prefect
server); it still imports nothing of trialflow's task library or flows -- the runner is deployed by
its entrypoint path.

Lifecycle. ``prepare`` checks the work pool exists and deploys the runner once per experiment as
``trialflow-trial/trialflow-<experiment>`` on it (from trialflow's own installed source: the pool's
workers need trialflow installed at the same path, as a process pool on this machine has it, or an
image with it), or uses the ``deployment`` the config names. A trial's flow run is named
``nni_exp_<exp>_trial_<trial>`` and created with that name as its idempotency key, so a retried
submit returns the same run, never a second one; its parameters are the run script's path, the
metrics URL and the *name* of the Secret block holding its metrics token (``trialflow-<exp>-...``),
never the token. ``job_variables`` go with every run. Submitted from the experiment's
``submit-<trial>`` task run, a run is a subflow run of the experiment's run, with its tags. Code, the
trial runtime and trial files live on the shared storage (``localStorageMountPoint`` here,
``containerStorageMountPoint`` on the workers). A restarted controller finds its runs again by name.
``close`` removes the deployment made for the experiment once no run needs it.

Liveness. Prefect shows a run Running until its process reports, so a run whose worker or
infrastructure died would stay Running for ever. The runner flow touches a heartbeat file beside its
run script every 2 s until its final state is set; a Running run whose heartbeat is older than
:data:`STALE_SECONDS` -- or that has not beaten once that long after entering Running -- is set
Crashed in Prefect, an interruption of its trial (the row CRASHED below), unless the trial's command
had already exited 0 (its keeper's record): that trial SUCCEEDED, only its run's end went unreported.

State table (the flow run's state type):

=======================================  ================================================
SCHEDULED, PENDING, PAUSED               WAITING
RUNNING, CANCELLING                      RUNNING (a cancel in progress)
COMPLETED                                SUCCEEDED
FAILED                                   FAILED (the trial's exit code and stderr tail from
                                         the shared storage)
CRASHED                                  an interruption (its worker or infrastructure
                                         went): the trial runs again as a run of its own
                                         (``..._r<attempt>``); SUCCEEDED after the trial's
                                         command exited 0; FAILED past maxInterruptions
CANCELLED                                USER_CANCELED / EARLY_STOPPED when trialflow cancelled
                                         it, otherwise SYS_CANCELED
=======================================  ================================================
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.blocks.system import Secret
from pydantic import SecretStr

from ..config.sections.prefect_pool import PrefectPoolConfig
from ..trial.procs import read_json
from ..trial.protocol import PARAMETER_FILE
from .base import PlatformError, TransientPlatformError, TrialStatus
from .errors import http_error
from .mounted_share import MountedShare
from .platform_row import Platform
from .rest_jobs import RestJobService

RUNNER_FLOW = "trialflow-trial"
# seconds the end of an experiment waits for its runs to end before removing their deployment: a cancelled
# trial's save (the runner's 20-s grace), the worker noticing the cancel and running the run's hooks
DEPLOYMENT_WAIT = 45.0
# seconds it waits for a cancelled run that never started: the worker acts on the cancel as it is told of it
# (it stops infrastructure it launched for the run, reading the deployment); Prefect refuses the run's
# Running while it is Cancelling, so an engine that starts later runs nothing
UNSTARTED_WAIT = 10.0
HEARTBEAT_FILE = ".runner-heartbeat"
STALE_SECONDS = 20.0
RUNNER_ENTRYPOINT = "trialflow/flows/trial_runner.py:trial_runner"
# Prefect's engine as ``python -m prefect.engine`` runs it, without the interpreter's last collection at exit
# (as trialflow's own processes: foundation.startup_gc), which walks all the run made and frees nothing the
# exit needs. Standard library only, so any interpreter with Prefect runs it.
ENGINE_CODE = ("import atexit, gc, runpy; atexit.register(gc.freeze); "
               "runpy.run_module('prefect.engine', run_name='__main__', alter_sys=True)")
log = logging.getLogger("trialflow.platforms.prefect_pool")
STATES = {
    "SCHEDULED": TrialStatus.WAITING, "PENDING": TrialStatus.WAITING, "PAUSED": TrialStatus.WAITING,
    "RUNNING": TrialStatus.RUNNING, "CANCELLING": TrialStatus.RUNNING,
    "COMPLETED": TrialStatus.SUCCEEDED,
    "FAILED": TrialStatus.FAILED, "CRASHED": TrialStatus.FAILED,
    "CANCELLED": TrialStatus.SYS_CANCELED,
}


def _client() -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def secret_name(job: str) -> str:
    """A Secret block name (lowercase letters, digits, dashes) for a job's metrics token."""
    return "trialflow-" + re.sub(r"[^a-z0-9-]+", "-", job.lower().replace("_", "-")) + "-" + \
        format(sum(1 << i for i, c in enumerate(job) if c.isupper()), "x")


def _detail(response: Any) -> str:
    """What the API said about a refused request (its ``detail``), cut to one line, or nothing."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return ""
    return f": {' '.join(str(detail).split())[:300]}" if detail else ""


class PrefectWorkPoolService(RestJobService[PrefectPoolConfig]):
    platform = "prefect"
    label = "Prefect"

    def __init__(self, config: PrefectPoolConfig, experiment_dir: Path) -> None:
        self.deployment_id: UUID | None = None
        super().__init__(config, experiment_dir)

    def connect(self) -> Any:
        return _client().__enter__()

    def platform_address(self) -> str:
        from prefect.settings import PREFECT_API_URL

        return str(PREFECT_API_URL.value() or "http://127.0.0.1")

    def _call(self, what: str, fn: Any) -> Any:
        """``fn()`` with Prefect API errors as platform errors: the API unreachable or a 5xx is transient."""
        import httpx
        from prefect.exceptions import ObjectNotFound

        try:
            return fn()
        except ObjectNotFound:
            raise
        except httpx.HTTPStatusError as exc:
            status = exc.response.status_code
            raise http_error(status, f"Prefect API {what}: HTTP {status}{_detail(exc.response)}",
                             f"Prefect API {what}: HTTP {status}: the API key was refused; check PREFECT_API_KEY"
                             ) from None
        except (httpx.TransportError, OSError) as exc:
            raise TransientPlatformError(f"Prefect API {what} at {self.platform_address()}: {exc}") from None

    # ---- prepare: the pool and the runner's deployment -------------------------------------------

    def check_platform(self) -> None:
        from prefect.exceptions import ObjectNotFound

        self.check_receiver_reachable()
        try:
            self._call("read_work_pool", lambda: self.api.read_work_pool(self.config.work_pool))
        except ObjectNotFound:
            raise PlatformError(f"work pool {self.config.work_pool!r} does not exist on {self.platform_address()}: "
                                f"create it (prefect work-pool create {self.config.work_pool} --type process) and "
                                "start a worker for it (prefect worker start --pool ...)") from None

    def prepare_platform(self) -> None:
        from prefect.exceptions import ObjectNotFound

        config = self.config
        if config.deployment:
            try:
                self.deployment_id = self._call("read_deployment", lambda: self.api.read_deployment_by_name(
                    config.deployment)).id
            except ObjectNotFound:
                raise PlatformError(f"deployment {config.deployment!r} does not exist; deploy trialflow's trial "
                                    f"runner ({RUNNER_ENTRYPOINT}) or leave 'deployment' out") from None
            return
        from prefect import Flow

        import trialflow

        source = Path(trialflow.__file__).resolve().parent.parent
        runner: Any = Flow.from_source(source=str(source), entrypoint=RUNNER_ENTRYPOINT)  # sync here: a Flow
        # registered as Flow.deploy would (the pool was checked when the service started), without its console
        # lines: advice about process pools and "Successfully created/updated all deployments!" printed into the
        # command's live table
        deployment = runner.to_deployment(name=f"trialflow-{self.experiment_id}",
                                          job_variables=self._deployment_job_variables())
        self.deployment_id = deployment.apply(work_pool_name=config.work_pool)

    def _deployment_job_variables(self) -> dict[str, Any]:
        """The config's job variables; on a process pool whose job template takes a ``command`` and when the
        config gives none, also this interpreter running Prefect's engine. A process worker then starts
        each run's engine itself, instead of through a workspace supervisor process that imports Prefect
        once more and runs state hooks in processes of their own: a second Prefect start per trial. This
        interpreter has what the runner needs (trialflow and its Prefect), and the workers already see
        trialflow's source at this path (the deployment's source). The engine skips the last collection
        at exit (:data:`ENGINE_CODE`)."""
        variables = dict(self.config.job_variables)
        if "command" in variables:
            return variables
        pool = self._call("read_work_pool", lambda: self.api.read_work_pool(self.config.work_pool))
        takes_command = "command" in (pool.base_job_template or {}).get("variables", {}).get("properties", {})
        if pool.type == "process" and takes_command:
            variables["command"] = shlex.join([sys.executable, "-c", ENGINE_CODE])
        return variables

    # ---- what the shared-storage base asks ------------------------------------------------------

    def make_storage(self) -> MountedShare:
        config = self.config
        local = config.local_storage_mount_point or self.experiment_dir.parent / ".prefect-share"
        local.mkdir(parents=True, exist_ok=True)
        return MountedShare(local, config.container_storage_mount_point or str(local), "the shared storage")

    def roles(self) -> dict[str, str]:
        return {"trial": self.config.trial_command}

    def job_name(self, kind: str, ident: str) -> str:
        return f"nni_exp_{self.experiment_id}_{kind}_{ident}"

    def run_ident(self, trial_id: str, attempt: int) -> str:
        return trial_id + (f"_r{attempt}" if attempt else "")

    def find_jobs(self, name: str) -> list[tuple[str, str]]:
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

        runs = self._call("read_flow_runs", lambda: self.api.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))))
        return [(str(r.id), str(r.created)) for r in runs]

    def start_job(self, name: str, ids: dict[str, str], commands: dict[str, list[str]], token_ref: str) -> None:
        if self.deployment_id is None:
            raise PlatformError("the trial runner is not deployed: prepare() the service first")
        command = commands["trial"]
        parameters = {"command": command, "metrics_url": self.metrics_url(),
                      "token_block": secret_name(token_ref) if self.metrics_url() else None,
                      "heartbeat": posixpath.join(posixpath.dirname(command[-1]), HEARTBEAT_FILE),
                      "trial": self._hyper_parameters(ids)}
        from prefect.deployments import run_deployment

        # Prefect's own way to start a deployment's run from a flow: submitted from one of the
        # experiment's task runs (trialflow's ``submit-<trial>``) it is a subflow run of the sweep (its
        # Subflow Runs tab, its run graph), under a task run made for it at once (the submitting task
        # run itself may not be recorded yet: the kept server writes task runs in batches)
        run = self._call("run_deployment", lambda: run_deployment(
            self.deployment_id, parameters=parameters, flow_run_name=name, idempotency_key=name,
            job_variables=self.config.job_variables or None, tags=self._sweep_tags(), timeout=0, as_subflow=True))
        self.remember_job_id(name, str(run.id))

    def _sweep_tags(self) -> list[str]:
        """The experiment run's tags (when submitted from it), ``trialflow`` and the experiment id."""
        from prefect.context import FlowRunContext

        sweep = FlowRunContext.get()
        tags = [*(sweep.flow_run.tags if sweep is not None and sweep.flow_run is not None else ()),
                "trialflow", self.experiment_id]
        return list(dict.fromkeys(tags))

    def _hyper_parameters(self, ids: dict[str, str]) -> dict[str, Any] | None:
        """A trial's id and hyper-parameters, shown with its run (None for an environment)."""
        if "trialId" not in ids:
            return None
        record = read_json(str(self.storage.path(self.experiment_id, "trials", ids["trialId"], PARAMETER_FILE)))
        return {"id": ids["trialId"], "parameters": (record or {}).get("parameters")}

    def job_status(self, name: str) -> tuple[TrialStatus, str | None] | None:
        from prefect.exceptions import ObjectNotFound

        run_id = self.job_id(name)
        if run_id is None:
            return None
        try:
            run = self._call("read_flow_run", lambda: self.api.read_flow_run(UUID(run_id)))
        except ObjectNotFound:
            return None
        state = run.state
        kind = state.type.value if state is not None else "SCHEDULED"
        why = state.message if state is not None else None
        if kind == "RUNNING" and self._stopped_beating(name, state.timestamp.timestamp()):
            from prefect.states import Crashed

            why = (f"flow run {run.name} stopped beating for {STALE_SECONDS:.0f} s while Running: its worker "
                   "or infrastructure is gone")
            self._call("set_flow_run_state", lambda: self.api.set_flow_run_state(
                run.id, Crashed(message=why), force=True))
            kind = "CRASHED"
        run_of, ident = self._run_of(name)
        if kind == "CRASHED" and run_of == "trial" and self.keeper_exit_code(ident) == 0:
            # the trial's command succeeded before its run's process went (the run only failed to report
            # its end): the trial's own outcome stands
            return self.outcome(name, "COMPLETED", STATES)
        # a Crashed run: its worker or infrastructure went, not the trial (a trial's own failure fails its run)
        self.note_interruption(name, f"flow run {name} crashed: {why or 'Crashed'}" if kind == "CRASHED" else None)
        return self.outcome(name, kind, STATES, why)

    def _run_of(self, name: str) -> tuple[str, str]:
        """``("trial" | "env", id)`` of job ``name`` (a trial's run after an interruption: its trial's id)."""
        kind, ident = name.removeprefix(f"nni_exp_{self.experiment_id}_").split("_", 1)
        return kind, ident.split("_r", 1)[0]

    def _stopped_beating(self, name: str, running_since: float) -> bool:
        """Whether job ``name``, Running in Prefect since ``running_since`` (epoch seconds), has not beaten
        for :data:`STALE_SECONDS`. A run that never beat counts from when it entered Running: its
        process may have died between Prefect's Running and the flow's first beat."""
        kind, ident = self._run_of(name)
        beat = self.storage.path(self.experiment_id, "trials" if kind == "trial" else "envs", ident, HEARTBEAT_FILE)
        try:  # a beat from before this run entered Running is an earlier run's
            last = max(beat.stat().st_mtime, running_since)
        except FileNotFoundError:
            last = running_since
        return time.time() - last > STALE_SECONDS

    def delete_job(self, name: str) -> None:
        from prefect.exceptions import ObjectNotFound
        from prefect.states import Cancelling

        run_id = self.job_id(name)
        if run_id is not None:
            try:
                run = self._call("read_flow_run", lambda: self.api.read_flow_run(UUID(run_id)))
                if run.state is None or not run.state.is_final():
                    self._call("set_flow_run_state", lambda: self.api.set_flow_run_state(
                        UUID(run_id), Cancelling(message="cancelled by trialflow"), force=True))
            except ObjectNotFound:
                pass
        self.forget_state(name)

    # ---- tokens: Prefect Secret blocks (the run reads them by name) --------------------------------

    def store_token(self, name: str, token: str, ids: dict[str, str]) -> str:
        stored = self.read_token(name)
        if stored:
            return stored
        self._call("save Secret", lambda: Secret(value=SecretStr(token)).save(secret_name(name), overwrite=True))
        return token

    def read_token(self, name: str) -> str | None:
        try:
            block: Any = Secret.load(secret_name(name))  # sync here: the block
            return str(block.get())
        except ValueError:  # no such block
            return None

    def delete_token(self, name: str) -> None:
        try:
            Secret.delete(secret_name(name))
        except (ValueError, LookupError):
            pass
        except Exception as exc:  # noqa: BLE001 -- Prefect raises ObjectNotFound for a deleted block
            if type(exc).__name__ != "ObjectNotFound":
                raise

    def close(self) -> None:
        """Stop the environments and the receiver (trial runs are left as they are), then remove the
        runner's deployment made for this experiment once none of its runs is still going (a worker
        needs it to start or cancel one): a nightly sweep leaves none behind. A deployment the config
        names is the user's and stays."""
        super().close()
        if self.deployment_id is not None and not self.config.deployment:
            self._remove_deployment(self.deployment_id)

    def _remove_deployment(self, deployment_id: UUID) -> None:
        """Delete the deployment once none of its runs is going: the worker reads it to start a run, to
        stop the infrastructure it launched for a run cancelled before it started, and, once a cancelled
        run's process has ended, to run its cancellation hooks. A cancelled run that started is waited for
        up to :data:`DEPLOYMENT_WAIT` seconds (a cancelled trial saves within the runner's grace); still
        Cancelling after that, it has had its stop and loses only its hooks. One that never started is
        waited for up to :data:`UNSTARTED_WAIT` seconds: a process worker told of the cancel before it had
        the run's process, whose engine Prefect then refuses, leaves such a run Cancelling until the
        server's cancellation cleanup sets it Cancelled (Prefect 3.9: after 300 s). It is not set Cancelled
        here: Prefect accepts a Running from Cancelled (a rerun), so a process started late would run. A run
        left going (a controller that stops without stopping its trials leaves them for a resume) keeps
        the deployment, with a line saying how to remove it. Never raises: the experiment's end is
        recorded already."""
        from prefect.client.schemas.filters import (
            DeploymentFilter,
            DeploymentFilterId,
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
        )
        from prefect.client.schemas.objects import TERMINAL_STATES, StateType

        going = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
            any_=[t for t in StateType if t not in TERMINAL_STATES])))
        ours = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        began = time.monotonic()
        try:
            with _client() as client:
                while running := client.read_flow_runs(flow_run_filter=going, deployment_filter=ours, limit=20):
                    if not all(r.state is not None and r.state.type == StateType.CANCELLING for r in running):
                        log.info("the trial runner's deployment stays while flow run %s ends: `prefect deployment "
                                 "delete %s/trialflow-%s` removes it", running[0].name, RUNNER_FLOW,
                                 self.experiment_id)
                        return
                    waited = time.monotonic() - began
                    if all(waited >= (DEPLOYMENT_WAIT if r.start_time else UNSTARTED_WAIT) for r in running):
                        break  # each still ends itself, or never runs, without the deployment
                    time.sleep(0.5)
                client.delete_deployment(deployment_id)
        except Exception as exc:  # noqa: BLE001 -- a deployment left behind is no reason to fail the run
            log.warning("the trial runner's deployment could not be removed (%s): `prefect deployment delete "
                        "%s/trialflow-%s` removes it", exc, RUNNER_FLOW, self.experiment_id)


PLATFORM = Platform(PrefectPoolConfig, PrefectWorkPoolService)  # the controller's own Prefect API: no credentials
