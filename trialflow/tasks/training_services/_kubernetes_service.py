"""The Kubernetes training-service skeleton; kubeflow.py, frameworkcontroller.py and adaptdl.py add
their manifests and state tables.

Lifecycle. ``prepare()`` connects (kubeconfig, credentials block or in-cluster), checks the
namespace and the shared storage's local mount, installs the trial runtime on the storage and, for
``metricChannel: http``, starts the metrics receiver (the port is kept in the experiment directory,
so a resumed controller listens where running pods push). ``upload_code()`` extracts the code
bundle on the storage once per content hash.

Without reuse, ``submit`` writes the trial directory on the storage (``parameter.cfg``, the keeper
spec and one ``run_<role>.sh`` per role), creates the trial's token Secret, then the job, named
deterministically (NNI's names) and looked up first, so a retried submit never creates a second
one. ``poll`` reads the job and maps its state through the platform's table; metrics come from the
receiver (then, at the end, the pod logs fill any gap), from the pod logs only, or from the file on
the storage. ``cancel`` deletes the job (the flow recorded the status first). A job deleted by
someone else ends the trial as SYS_CANCELED.

With ``reuseMode: true`` an environment is one long-lived job whose pod runs the reuse worker on
the storage; trials are queued to it as files, and an environment takes the next trial when its
last one ended (never more environments than trials in flight). Trial state and metrics are read
from the trial directory; a trial whose environment job ended or vanished is SYS_CANCELED. ``close()``
stops and deletes the environments.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...trial.procs import read_json, write_atomic
from ...trial.records import MetricRecord, parse_stdout_lines
from ..metrics_receiver import MetricsReceiver
from ._kubernetes import KubeApi, SharedStorage, k8s_id, labels, new_api_client
from .base import (
    CodeRef,
    LostHandleError,
    PlatformError,
    TrainingService,
    TrialHandle,
    TrialSpec,
    TrialStatus,
    TrialUpdate,
)
from .local import READ_CHUNK, read_metrics_file, read_trial_logs, tail_text
from .runtime_files import runtime_files, runtime_key

ENV_CHECK_SECONDS = 2.0
HEARTBEAT_SECONDS = 10.0
WORKER_IDLE_TIMEOUT = 900.0
_CHANNEL_ENV = {"http": "http", "logs": "stdout", "file": "file"}


@dataclass
class Environment:
    """A reuse-mode job and the trial it runs (one at a time)."""

    id: str
    job: str
    trial: str | None = None
    ended: str | None = None  # why the job is gone
    token: str | None = None  # its metrics token (HTTP channel), kept to grant each new trial
    checked: float = 0.0


class KubernetesTrainingService(TrainingService):
    group = ""
    version = "v1"
    plural = ""
    reuse_supported = True

    def __init__(self, config: Any, experiment_dir: Path) -> None:
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.experiment_id = self.experiment_dir.name
        self.namespace = config.namespace
        self.channel = config.metric_channel
        self.reuse = bool(getattr(config, "reuse_mode", False)) and self.reuse_supported
        self.storage = self.make_storage()
        self.worker_idle_timeout = WORKER_IDLE_TIMEOUT
        self._api: KubeApi | None = None
        self.receiver: MetricsReceiver | None = None
        self._lock = threading.Lock()
        self._seen: dict[str, set[tuple[str, int]]] = {}
        self._cancelled: dict[str, TrialStatus] = {}
        self.envs: dict[str, Environment] = {}
        self._last_heartbeat = 0.0

    # ---- platform specifics ----------------------------------------------------------------------

    @abstractmethod
    def make_storage(self) -> SharedStorage: ...

    @abstractmethod
    def roles(self) -> dict[str, str]:
        """Role name -> the command its replicas run (non-reuse); the first role is the primary one."""

    @abstractmethod
    def job_name(self, kind: str, ident: str) -> str:
        """NNI's name of a trial (``kind='trial'``) or environment (``'env'``) job."""

    @abstractmethod
    def manifest(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]],
                 env: list[dict[str, Any]]) -> dict[str, Any]:
        """The job object; ``commands`` holds each role's container command."""

    @abstractmethod
    def job_state(self, obj: dict[str, Any]) -> tuple[TrialStatus, str | None]:
        """The platform's state table: the job object's status as a trial status and message."""

    @abstractmethod
    def pod_selector(self, name: str) -> str: ...

    def before_create(self, name: str, object_labels: dict[str, str], commands: dict[str, list[str]]) -> None:
        """Create objects the job needs besides its Secret (AdaptDL: PVC and ConfigMap)."""

    def after_delete(self, name: str) -> None:
        """Delete what ``before_create`` made."""

    def prepare_platform(self) -> None:
        """Platform checks and one-off objects (registry and storage secrets)."""

    # ---- prepare and code ------------------------------------------------------------------------

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi(new_api_client(self.config.credentials), self.namespace)
        return self._api

    def prepare(self) -> None:
        self.api.check_namespace()
        self.storage.check()
        self.storage.install_runtime(runtime_key(), runtime_files())
        self.prepare_platform()
        if self.channel == "http":
            self._start_receiver()

    def _start_receiver(self) -> None:
        state = self.experiment_dir / "metrics-receiver.json"
        previous = read_json(str(state)) or {}
        host = self.config.nni_manager_ip or "127.0.0.1"
        self.receiver = MetricsReceiver(host, int(previous.get("port") or 0)).start()
        self.experiment_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(str(state), {"port": self.receiver.port})

    @property
    def runtime_dir(self) -> str:
        return self.storage.container_path("runtime", runtime_key())

    def upload_code(self, code_dir: Path) -> CodeRef:
        digest = self.storage.install_code(code_dir, self.experiment_dir.parent / ".cache" / "bundle-hashes.json")
        return CodeRef(self.storage.container_path("code", digest), digest)

    # ---- submit ----------------------------------------------------------------------------------

    def _keeper_spec(self, spec: TrialSpec, code: CodeRef) -> dict[str, Any]:
        env = {"NNI_PLATFORM": self.platform, "NNI_EXP_ID": spec.experiment_id, "NNI_TRIAL_JOB_ID": spec.trial_id,
               "NNI_TRIAL_SEQ_ID": str(spec.sequence), "TRIALFLOW_METRIC_CHANNEL": _CHANNEL_ENV[self.channel]}
        if self.reuse and self.channel == "logs":
            env["TRIALFLOW_METRIC_CHANNEL"] = "stdout"  # read back from trial.stdout on the storage
        if not spec.gpu_number:
            env["CUDA_VISIBLE_DEVICES"] = ""  # NNI: no GPU asked for means none visible
        command = spec.command if self.reuse else next(iter(self.roles().values()))
        return {"command": command, "cwd": f"../../../code/{code.content_hash}", "env": env, "located": True,
                "roles": self.roles()}

    def _metric_env(self, token_secret: str) -> list[dict[str, Any]]:
        if self.receiver is None:
            return []
        return [{"name": "TRIALFLOW_METRICS_URL", "value": self.receiver.url},
                {"name": "TRIALFLOW_METRICS_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": token_secret, "key": "token"}}}]

    def _token(self, secret: str, object_labels: dict[str, str], *trial_ids: str) -> str | None:
        """The token of ``secret`` (created unless it exists), granted ``trial_ids``."""
        if self.receiver is None:
            return None
        token = self.api.ensure_secret(secret, {"token": self.receiver.new_token()}, object_labels)["token"]
        self.receiver.grant(token, *trial_ids)
        return token

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        trial_dir = self.storage.path(spec.experiment_id, "trials", spec.trial_id)
        (trial_dir / ".nni").mkdir(parents=True, exist_ok=True)
        write_atomic(str(trial_dir / "parameter.cfg"), spec.parameter_record())
        keeper = self._keeper_spec(spec, code)
        write_atomic(str(trial_dir / ".nni" / "keeper.json"), keeper)
        self._seen.setdefault(spec.trial_id, set())
        if self.reuse:
            return self._submit_to_environment(spec, keeper)
        name = self.job_name("trial", spec.trial_id)
        object_labels = labels(spec.experiment_id, trialId=spec.trial_id)
        primary = next(iter(self.roles()))
        commands = {}
        for role in self.roles():
            script = trial_dir / f"run_{role.lower()}.sh"
            write_atomic(str(script), self._script(["--pod", self._rel("trials", spec.trial_id), role, primary],
                                                   "keeper"))
            commands[role] = ["sh", self.storage.container_path(spec.experiment_id, "trials", spec.trial_id,
                                                                script.name)]
        self._token(f"{name}-token", object_labels, spec.trial_id)
        self.before_create(name, object_labels, commands)
        self.api.create_job(self.group, self.version, self.plural,
                            self.manifest(name, object_labels, commands, self._metric_env(f"{name}-token")))
        return TrialHandle(spec.trial_id, self.platform, {"job": name, "namespace": self.namespace, "reuse": False})

    @staticmethod
    def _rel(*parts: str) -> str:
        return "/".join(parts)

    def _script(self, args: list[str], module: str) -> str:
        """A run script that finds the runtime relative to itself (the controller and the pod see the
        storage at different paths)."""
        quoted = " ".join(f"\"$exp/{a}\"" if "/" in a else f"'{a}'" for a in args)
        return ("#!/bin/sh\n# written by trialflow: runs in the pod\n"
                'here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)\n'
                'exp=$(CDPATH= cd -- "$here/../.." && pwd)\n'
                'nni=$(CDPATH= cd -- "$exp/.." && pwd)\n'
                f'PYTHONPATH="$nni/runtime/{os.path.basename(self.runtime_dir)}" '
                f"exec python3 -S -m trialflow.trial.{module} {quoted}\n")

    # ---- reuse-mode environments -------------------------------------------------------------------

    def _submit_to_environment(self, spec: TrialSpec, keeper: dict[str, Any]) -> TrialHandle:
        env = self._free_environment(spec.trial_id)
        env_dir = self.storage.path(self.experiment_id, "envs", env.id)
        payload = {"trial_dir": f"../../trials/{spec.trial_id}", "parameter": spec.parameter_record(),
                   "keeper": keeper}
        if self.receiver is not None and env.token is not None:
            self.receiver.grant(env.token, spec.trial_id)
        elif self.receiver is not None:  # an environment re-attached on resume: its token is in its Secret
            env.token = self._token(f"{env.job}-token", labels(self.experiment_id, envId=env.id), spec.trial_id)
        (env_dir / "queue").mkdir(parents=True, exist_ok=True)
        write_atomic(str(env_dir / "queue" / f"{spec.trial_id}.json"), json.dumps(payload))
        return TrialHandle(spec.trial_id, self.platform, {"job": env.job, "env": env.id, "namespace": self.namespace,
                                                          "reuse": True})

    def _free_environment(self, trial_id: str) -> Environment:
        """An idle environment, now running ``trial_id``; a new one when none is idle."""
        with self._lock:
            for env in self.envs.values():
                if env.trial is None and env.ended is None:
                    env.trial = trial_id
                    return env
            env_id = secrets.token_hex(4)
            env = Environment(env_id, self.job_name("env", env_id), trial_id)
            self.envs[env_id] = env
        env_dir = self.storage.path(self.experiment_id, "envs", env_id)
        env_dir.mkdir(parents=True, exist_ok=True)
        (env_dir / "heartbeat").write_text(str(time.time()))
        write_atomic(str(env_dir / "run.sh"), self._script(
            ["--foreground", self._rel("envs", env_id), str(self.worker_idle_timeout)], "worker"))
        object_labels = labels(self.experiment_id, envId=env_id)
        env.token = self._token(f"{env.job}-token", object_labels)
        primary = next(iter(self.roles()))
        command = ["sh", self.storage.container_path(self.experiment_id, "envs", env_id, "run.sh")]
        self.before_create(env.job, object_labels, {primary: command})
        self.api.create_job(self.group, self.version, self.plural, self.manifest(
            env.job, object_labels, {primary: command}, self._metric_env(f"{env.job}-token")))
        return env

    def _assign(self, handle: TrialHandle) -> Environment:
        with self._lock:
            env = self.envs.get(str(handle.data.get("env")))
            if env is None:
                env = self.envs[handle.data["env"]] = Environment(handle.data["env"], handle.data["job"])
            env.trial = handle.trial_id
            return env

    def _environment_gone(self, env: Environment) -> str | None:
        now = time.monotonic()
        if env.ended is None and now - env.checked >= ENV_CHECK_SECONDS:
            env.checked = now
            obj = self.api.get_job(self.group, self.version, self.plural, env.job)
            if obj is None:
                env.ended = f"its environment job {env.job} was deleted"
            else:
                status, message = self.job_state(obj)
                if status.is_terminal:
                    env.ended = f"its environment job {env.job} ended ({status.value}: {message})"
        return env.ended

    def _heartbeat(self) -> None:
        if time.monotonic() - self._last_heartbeat < HEARTBEAT_SECONDS:
            return
        self._last_heartbeat = time.monotonic()
        for env in list(self.envs.values()):
            if env.ended is None:
                try:
                    (self.storage.path(self.experiment_id, "envs", env.id) / "heartbeat").write_text(str(time.time()))
                except OSError:
                    pass

    # ---- poll ----------------------------------------------------------------------------------

    def _trial_dir(self, handle: TrialHandle) -> Path:
        return self.storage.path(self.experiment_id, "trials", handle.trial_id)

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        cursor = dict(cursor)
        if not (self._trial_dir(handle) / ".nni").is_dir():
            raise LostHandleError(f"trial {handle.trial_id}: its directory {self._trial_dir(handle)} is missing on "
                                  "the shared storage")
        if handle.data.get("reuse"):
            return self._poll_reuse(handle, cursor)
        obj = self.api.get_job(self.group, self.version, self.plural, handle.data["job"])
        if obj is None:
            status = self._cancelled.get(handle.trial_id, TrialStatus.SYS_CANCELED)
            message: str | None = (None if handle.trial_id in self._cancelled
                                   else f"job {handle.data['job']} was deleted outside trialflow")
        else:
            status, message = self.job_state(obj)
        records, errors = self._metrics(handle, cursor, status.is_terminal and obj is not None)
        if not status.is_terminal:
            return TrialUpdate(status, records, cursor, None, message, errors)
        return self._ended(handle, status, message, records, cursor, errors)

    def _ended(self, handle: TrialHandle, status: TrialStatus, message: str | None, records: list[MetricRecord],
               cursor: dict[str, Any], errors: list[str]) -> TrialUpdate:
        trial_dir = self._trial_dir(handle)
        state = read_json(str(trial_dir / ".nni" / "state")) or {}
        exit_code = state.get("exit_code")
        if status == TrialStatus.FAILED:
            tail = tail_text(str(trial_dir / "trial.stderr"))
            message = (f"exit code {exit_code}; " if exit_code is not None else "") + (message or "failed") + \
                (f"; stderr tail:\n{tail}" if tail else "")
        self._finish(handle)
        return TrialUpdate(status, records, cursor, exit_code if isinstance(exit_code, int) else None, message, errors)

    def _poll_reuse(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        env = self._assign(handle)
        self._heartbeat()
        trial_dir = self._trial_dir(handle)
        meta = trial_dir / ".nni"
        state = read_json(str(meta / "state"))
        records, errors = self._metrics(handle, cursor, state is not None)
        if state is not None:
            code = state.get("exit_code")
            if code is None:
                return self._ended(handle, self._cancelled.get(handle.trial_id, TrialStatus.SYS_CANCELED),
                                   "cancelled before it started", records, cursor, errors)
            status = TrialStatus.SUCCEEDED if code == 0 else self._cancelled.get(handle.trial_id, TrialStatus.FAILED)
            return self._ended(handle, status, None, records, cursor, errors)
        gone = self._environment_gone(env)
        if gone is not None:
            return self._ended(handle, self._cancelled.get(handle.trial_id, TrialStatus.SYS_CANCELED),
                               f"the trial did not finish: {gone}", records, cursor, errors)
        status = TrialStatus.RUNNING if (meta / "started").exists() else TrialStatus.WAITING
        return TrialUpdate(status, records, cursor, None, None, errors)

    def _metrics(self, handle: TrialHandle, cursor: dict[str, Any], final: bool
                 ) -> tuple[list[MetricRecord], list[str]]:
        """New metrics of the trial from its channel(s), without duplicates."""
        records: list[MetricRecord] = []
        errors: list[str] = []
        trial_dir = self._trial_dir(handle)
        if self.channel == "file":
            records, errors, cursor["metrics_offset"] = read_metrics_file(
                trial_dir, int(cursor.get("metrics_offset", 0)), handle.trial_id)
        else:
            if self.receiver is not None:
                records = self.receiver.drain(handle.trial_id)
            if self.channel == "logs" or final:  # logs: the channel; http: the gap filler at the end
                offsets = dict(cursor.get("log_offsets") or {})
                if handle.data.get("reuse"):  # the trial's own stdout file, read from where we left off
                    start = int(offsets.get("trial.stdout", 0))
                    logs = {"trial.stdout": (start, _read_from(trial_dir / "trial.stdout", start))}
                else:  # pod logs come whole: skip what was read before
                    logs = {pod: (int(offsets.get(pod, 0)), data[int(offsets.get(pod, 0)):])
                            for pod, data in self.api.pod_logs(self.pod_selector(handle.data["job"])).items()}
                for pod, (start, data) in logs.items():
                    result = parse_stdout_lines(data, start, handle.trial_id)
                    records += result.records
                    errors += result.errors
                    offsets[pod] = result.offset
                cursor["log_offsets"] = offsets
        seen = self._seen.setdefault(handle.trial_id, set())
        fresh = []
        for record in records:
            if (record.type, record.sequence) not in seen:
                seen.add((record.type, record.sequence))
                fresh.append(record)
        return fresh, errors

    def _finish(self, handle: TrialHandle) -> None:
        with self._lock:
            for env in self.envs.values():
                if env.trial == handle.trial_id:
                    env.trial = None
        if not handle.data.get("reuse"):
            self.api.delete("secret", f"{handle.data['job']}-token")
        self._seen.pop(handle.trial_id, None)
        if self.receiver is not None:
            self.receiver.forget(handle.trial_id)

    # ---- cancel, adopt, logs, close ------------------------------------------------------------

    def cancel(self, handle: TrialHandle, reason: TrialStatus) -> None:
        self._cancelled[handle.trial_id] = reason
        if not handle.data.get("reuse"):
            self.api.delete_job(self.group, self.version, self.plural, handle.data["job"])
            self.after_delete(handle.data["job"])
            self.api.delete("secret", f"{handle.data['job']}-token")
            return
        env_dir = self.storage.path(self.experiment_id, "envs", str(handle.data["env"]))
        try:
            (env_dir / "queue" / f"{handle.trial_id}.json").unlink()
        except FileNotFoundError:
            pass
        (env_dir / "kill").mkdir(parents=True, exist_ok=True)
        write_atomic(str(env_dir / "kill" / handle.trial_id), f"../../trials/{handle.trial_id}")

    def adopt(self, handle: TrialHandle) -> None:
        """Re-attach after a restart: the environment is known again, and the token (read back from
        its Secret) is accepted again by this controller's receiver."""
        self._seen.setdefault(handle.trial_id, set())
        if handle.data.get("reuse"):
            self._assign(handle)
        if self.receiver is not None:
            secret = self.api.read_secret(f"{handle.data['job']}-token")
            if secret and secret.get("token"):
                self.receiver.grant(secret["token"], handle.trial_id)

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        return read_trial_logs(self._trial_dir(handle), tail)

    def close(self) -> None:
        """Stop and delete the reuse environments; stop the receiver. Trial jobs are left as they are."""
        for env in list(self.envs.values()):
            try:
                (self.storage.path(self.experiment_id, "envs", env.id) / "stop").write_text("")
                self.api.delete_job(self.group, self.version, self.plural, env.job)
                self.after_delete(env.job)
                self.api.delete("secret", f"{env.job}-token")
            except PlatformError:
                pass
        self.envs.clear()
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(READ_CHUNK)
    except OSError:
        return b""


def resources(cpu: float | None, memory_mb: int | str | None, gpus: int | None) -> dict[str, Any]:
    """A container's requests and limits in NNI's form (``<MB>Mi``; GPUs only when asked for)."""
    amounts: dict[str, str] = {}
    if cpu is not None:
        amounts["cpu"] = str(int(cpu)) if float(cpu).is_integer() else str(cpu)
    if memory_mb is not None:
        amounts["memory"] = f"{memory_mb}Mi" if isinstance(memory_mb, int) else str(memory_mb)
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def storage_volume(storage: Any, secret_name: str | None) -> dict[str, Any]:
    """The ``nni-vol`` volume of NNI's manifests: NFS, or an Azure File share with its Secret."""
    if storage.storage_type == "nfs":
        return {"name": "nni-vol", "nfs": {"server": storage.server, "path": storage.path}}
    return {"name": "nni-vol", "azureFile": {"secretName": secret_name, "shareName": storage.azure_share,
                                             "readOnly": False}}


__all__ = ["Environment", "KubernetesTrainingService", "k8s_id", "resources", "storage_volume"]
