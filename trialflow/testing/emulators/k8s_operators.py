"""The emulator's controller: plays kubelet and the operators (training-operator, FrameworkController,
AdaptDL scheduler) for the Kubernetes API emulator.

Pods. Each replica becomes a Pod object and a local process running the first container's command
and args (init containers run first, in order; other containers are ignored). The image name is
ignored: the process uses this machine's tools, with this Python first on PATH. Volumes map to local
directories -- ``nfs`` through the emulator's ``nfs_exports``, ``persistentVolumeClaim`` and
``azureFile`` to folders under the emulator's directory, ``emptyDir`` to a fresh folder,
``configMap`` / ``secret`` to their files -- and every container path under a ``volumeMount`` is
rewritten to its local folder in the command, args and env values. ``env`` takes ``value`` and
``valueFrom.secretKeyRef``. Output (stdout and stderr) is the pod's log. A volume whose source is
missing keeps the pod Pending with the reason, as a kubelet would.

Jobs. Status is written as each operator does: Kubeflow conditions (Created, Running, Succeeded,
Failed; the job succeeds when its Chief/Master -- or, without one, every Worker -- succeeds and fails
when any replica fails, then running replicas are removed), FrameworkController attempt states with a
completion status (exit code, Succeeded/Failed, Transient/Permanent; ``executionType: Stop`` ends it
with -210), AdaptDL phases (Pending, Starting, Running, Succeeded/Failed). Deleting a job deletes its
pods, each stopped as a kubelet stops a container: SIGTERM to its first process, SIGKILL to all it held
after the grace period.

Threads. The reconcile loop, each pod's thread, the API server's handlers and a test's own calls
(:meth:`Controller.disrupt`) share the jobs and their pods: each reads or changes them under the
cluster's lock.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import base_env, map_mounts, stop_container

TICK = 0.02
KUBEFLOW = {"tfjobs": ("tfReplicaSpecs", "tfjob-controller"), "pytorchjobs": ("pytorchReplicaSpecs",
                                                                             "pytorchjob-controller")}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class PodRun:
    """One pod: its API object (shared with the API server) and the thread running its process."""

    namespace: str
    name: str
    obj: dict[str, Any]
    role: str
    index: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    phase: str = "Pending"
    deleted: bool = False
    thread: threading.Thread | None = None
    disruption: str | None = None  # the DisruptionTarget reason Kubernetes ended the pod for


@dataclass
class JobRun:
    plural: str
    namespace: str
    name: str
    pods: list[PodRun] = field(default_factory=list)
    done: bool = False


class Controller:
    def __init__(self, cluster: Any, directory: Path, nfs_exports: dict[str, Path], kill_grace: float) -> None:
        self.cluster = cluster
        self.directory = directory
        self.nfs_exports = {k.rstrip("/"): Path(v) for k, v in nfs_exports.items()}
        self.kill_grace = kill_grace
        self.jobs: dict[tuple[str, str, str], JobRun] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="k8s-emulator-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self.cluster.lock:
            jobs = list(self.jobs.values())
        for job in jobs:
            self._remove_pods(job, wait=True)

    # ---- events from the API server ---------------------------------------------------------

    def _pod(self, ns: str, name: str, running: bool = False) -> PodRun | None:
        """The pod ``ns/name`` of a job (only while it runs, when ``running``); None when there is none."""
        with self.cluster.lock:
            return next((p for job in self.jobs.values() for p in job.pods if p.namespace == ns and p.name == name
                         and (not running or p.phase == "Running")), None)

    def deleted(self, plural: str, ns: str, name: str, obj: dict[str, Any]) -> None:
        with self.cluster.lock:
            job = self.jobs.pop((plural, ns, name), None)
        if job is not None:
            threading.Thread(target=self._remove_pods, args=(job,), daemon=True).start()
        if plural == "pods" and (pod := self._pod(ns, name)) is not None:
            pod.deleted = True
            threading.Thread(target=self._kill_pod, args=(pod,), daemon=True).start()

    def updated(self, plural: str, ns: str, obj: dict[str, Any]) -> None:
        if plural == "frameworks" and obj["spec"].get("executionType") == "Stop":
            job = self.jobs.get((plural, ns, obj["metadata"]["name"]))
            if job is not None and not job.done:
                job.done = True
                self._remove_pods(job, keep_objects=True)
                self._write_status(job, _framework_completed(obj, -210, "StopFrameworkRequested", "Failed",
                                                             "Permanent", "the framework was stopped by a user"))

    def start_disruption(self, ns: str, name: str, reason: str, message: str) -> None:
        """:meth:`disrupt` in the background (as the API answers an eviction at once); raises
        LookupError at once for a pod that is not running."""
        if self._pod(ns, name, running=True) is None:
            raise LookupError(f"no running pod {ns}/{name}")
        def disrupt() -> None:
            with contextlib.suppress(LookupError):  # it ended meanwhile
                self.disrupt(ns, name, reason, message)

        threading.Thread(target=disrupt, daemon=True).start()

    def disrupt(self, ns: str, name: str, reason: str, message: str) -> None:
        """Kubernetes ending a running pod apart from its command (preemption, eviction, a lost node):
        the ``DisruptionTarget`` condition with ``reason`` first, then its container is stopped as the
        kubelet stops one (SIGTERM to its first process, SIGKILL to all that is left after the grace
        period) and it ends Failed -- reason ``Evicted`` when the kubelet ended it
        (``TerminationByKubelet``). The pod object stays, as an evicted pod's does. Raises LookupError
        for a pod that is not running."""
        with self.cluster.lock:
            pod = self._pod(ns, name, running=True)
            if pod is None:
                raise LookupError(f"no running pod {ns}/{name}")
            pod.disruption = reason
            status = pod.obj["status"]
            status["conditions"] = [*(status.get("conditions") or []),
                                    {"type": "DisruptionTarget", "status": "True", "reason": reason,
                                     "message": message, "lastTransitionTime": _now()}]
            self.cluster.put("pods", pod.namespace, pod.obj)
        if pod.proc is not None and pod.proc.poll() is None:
            stop_container(pod.proc.pid, self.kill_grace)

    def pod_log(self, ns: str, name: str, query: dict[str, list[str]]) -> str:
        pod = self._pod(ns, name)
        if pod is None:
            return ""
        try:
            data = pod.log_path.read_bytes()
        except OSError:
            data = b""
        tail = query.get("tailLines")
        text = data.decode("utf-8", "replace")
        if tail:
            text = "\n".join(text.splitlines()[-int(tail[0]):]) + "\n"
        return text

    # ---- reconcile loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(TICK):
            for plural in ("tfjobs", "pytorchjobs", "frameworks", "adaptdljobs"):
                for obj in self.cluster.items(plural):
                    key = (plural, obj["metadata"]["namespace"], obj["metadata"]["name"])
                    job = self.jobs.get(key)
                    if job is None:
                        with self.cluster.lock:
                            job = self.jobs[key] = JobRun(*key)
                        self._create_pods(job, obj)
                    if not job.done:
                        self._reconcile(job, obj)

    def _create_pods(self, job: JobRun, obj: dict[str, Any]) -> None:
        name, labels = job.name, dict[str, str]()
        if job.plural in KUBEFLOW:
            key, operator = KUBEFLOW[job.plural]
            replicas = [(rtype, int(spec.get("replicas", 1)), spec["template"])
                        for rtype, spec in obj["spec"][key].items()]
            labels = _kubeflow_labels(job)
            self._write_status(job, {"conditions": [_condition("Created", f"{obj['kind']} {name} is created.")],
                                     "replicaStatuses": {}, "startTime": _now()})
        elif job.plural == "frameworks":
            if obj["spec"].get("executionType") == "Stop":
                return
            replicas = [(r["name"], int(r["taskNumber"]), r["task"]["pod"]) for r in obj["spec"]["taskRoles"]]
            self._write_status(job, {"state": "AttemptCreationPending", "startTime": _now(),
                                     "attemptStatus": {"id": 0, "completionStatus": None}})
        else:
            count = max(1, int(obj["spec"].get("minReplicas") or 1))
            replicas = [("main", count, obj["spec"]["template"])]
            self._write_status(job, {"phase": "Pending", "replicas": 0, "readyReplicas": 0, "group": 0})
        for rtype, count, template in replicas:
            for index in range(count):
                pod = self._start_pod(job, obj, rtype, index, template, labels)
                with self.cluster.lock:
                    job.pods.append(pod)

    def _pod_identity(self, job: JobRun, rtype: str, index: int, base: dict[str, str]) -> tuple[str, dict[str, str]]:
        if job.plural in KUBEFLOW:
            return (f"{job.name}-{rtype.lower()}-{index}",
                    {**base, "training.kubeflow.org/replica-type": rtype.lower(),
                     "training.kubeflow.org/replica-index": str(index)})
        if job.plural == "frameworks":
            return (f"{job.name}-{rtype}-{index}",
                    {"FC_FRAMEWORK_NAME": job.name, "FC_TASKROLE_NAME": rtype, "FC_TASK_INDEX": str(index)})
        return f"{job.name}-0-{index}", {"adaptdl/job": job.name, "adaptdl/group": "0", "adaptdl/rank": str(index)}

    def _start_pod(self, job: JobRun, obj: dict[str, Any], rtype: str, index: int, template: dict[str, Any],
                   base_labels: dict[str, str]) -> PodRun:
        name, labels = self._pod_identity(job, rtype, index, base_labels)
        labels = {**((template.get("metadata") or {}).get("labels") or {}), **labels}
        pod_obj = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": job.namespace, "labels": labels, "uid": name,
                                "creationTimestamp": _now(),
                                "ownerReferences": [{"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                                     "name": job.name, "uid": obj["metadata"].get("uid")}]},
                   "spec": template.get("spec") or {}, "status": {"phase": "Pending"}}
        self.cluster.put("pods", job.namespace, pod_obj)
        log_dir = self.directory / "pods" / job.namespace
        log_dir.mkdir(parents=True, exist_ok=True)
        pod = PodRun(job.namespace, name, pod_obj, rtype, index, log_dir / f"{name}.log")
        extra = _operator_env(job, obj, rtype, index)
        pod.thread = threading.Thread(target=self._run_pod, args=(pod, extra), daemon=True)
        pod.thread.start()
        return pod

    # ---- one pod --------------------------------------------------------------------------------

    def _run_pod(self, pod: PodRun, extra_env: dict[str, str]) -> None:
        spec = pod.obj["spec"]
        workdir = self.directory / "pod-volumes" / pod.namespace / pod.name
        while True:  # like a kubelet, wait for a missing PVC, Secret or ConfigMap to appear
            try:
                mounts = self._volumes(pod, spec, workdir)
                break
            except LookupError as exc:
                if pod.deleted or self._stop.is_set():
                    return
                self._set_pod(pod, "Pending", reason="ContainerCreating", message=str(exc))
                time.sleep(0.1)
        for container in list(spec.get("initContainers") or []) + [spec["containers"][0]]:
            if pod.deleted:
                return
            is_init = container is not spec["containers"][0]
            if is_init and "frameworkbarrier" in str(container.get("image", "")):
                _framework_barrier(container, mounts, pod)
                continue
            try:
                argv, env, cwd = self._container(pod, container, mounts, extra_env)
            except LookupError as exc:
                self._set_pod(pod, "Pending", reason="CreateContainerConfigError", message=str(exc))
                return
            with open(pod.log_path, "ab") as log:
                try:
                    pod.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
                except OSError as exc:
                    log.write(f"emulator: cannot start container {container.get('name')}: {exc}\n".encode())
                    pod.exit_code = 128
                    self._set_pod(pod, "Failed", exit_code=128)
                    return
            if not is_init:
                self._set_pod(pod, "Running")
            code = pod.proc.wait()
            code = 128 - code if code < 0 else code
            if code != 0 or not is_init:
                pod.exit_code = code
                self._set_pod(pod, "Succeeded" if code == 0 else "Failed", exit_code=code)
                return

    def _volumes(self, pod: PodRun, spec: dict[str, Any], workdir: Path) -> dict[str, Path]:
        volumes: dict[str, Path] = {}
        for volume in spec.get("volumes") or []:
            name = volume["name"]
            if "nfs" in volume:
                export = f"{volume['nfs']['server']}:{volume['nfs']['path']}".rstrip("/")
                if export not in self.nfs_exports:
                    raise LookupError(f"MountVolume.SetUp failed for volume {name!r}: mount.nfs: access denied by "
                                      f"server while mounting {export}")
                volumes[name] = self.nfs_exports[export]
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if self.cluster.get("persistentvolumeclaims", pod.namespace, claim) is None:
                    raise LookupError(f'persistentvolumeclaim "{claim}" not found')
                volumes[name] = self.directory / "pvc" / pod.namespace / claim
            elif "azureFile" in volume:
                secret = volume["azureFile"].get("secretName")
                if self.cluster.get("secrets", pod.namespace, secret) is None:
                    raise LookupError(f'secret "{secret}" not found (azureFile volume {name!r})')
                volumes[name] = self.directory / "azurefile" / volume["azureFile"]["shareName"]
            elif "configMap" in volume or "secret" in volume:
                volumes[name] = self._materialize(pod, volume, workdir / name)
            else:  # emptyDir and anything else: a fresh folder
                volumes[name] = workdir / name
            volumes[name].mkdir(parents=True, exist_ok=True)
        return volumes

    def _materialize(self, pod: PodRun, volume: dict[str, Any], target: Path) -> Path:
        if "configMap" in volume:
            ref = volume["configMap"]["name"]
            obj = self.cluster.get("configmaps", pod.namespace, ref)
            files = {k: v.encode() for k, v in ((obj or {}).get("data") or {}).items()}
            mode = int(volume["configMap"].get("defaultMode", 0o644))
        else:
            ref = volume["secret"]["secretName"]
            obj = self.cluster.get("secrets", pod.namespace, ref)
            files = {k: base64.b64decode(v) for k, v in ((obj or {}).get("data") or {}).items()}
            mode = int(volume["secret"].get("defaultMode", 0o644))
        if obj is None:
            raise LookupError(f'{"configmap" if "configMap" in volume else "secret"} "{ref}" not found')
        target.mkdir(parents=True, exist_ok=True)
        for key, data in files.items():
            (target / key).write_bytes(data)
            os.chmod(target / key, mode)
        return target

    def _container(self, pod: PodRun, container: dict[str, Any], volumes: dict[str, Path],
                   extra_env: dict[str, str]) -> tuple[list[str], dict[str, str], str | None]:
        mounts = []
        for mount in container.get("volumeMounts") or []:
            local = volumes.get(mount["name"])
            if local is None:
                raise LookupError(f"volumeMount {mount['name']!r} names no volume of the pod")
            if mount.get("subPath"):
                local = local / mount["subPath"]
                local.mkdir(parents=True, exist_ok=True)
            mounts.append((mount["mountPath"].rstrip("/") or "/", str(local)))

        def mapped(text: str) -> str:
            return map_mounts(text, mounts)

        env = {**base_env(pod.name), "KUBERNETES_POD_NAME": pod.name, **extra_env}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = mapped(str(item["value"]))
            elif "secretKeyRef" in (item.get("valueFrom") or {}):
                ref = item["valueFrom"]["secretKeyRef"]
                secret = self.cluster.get("secrets", pod.namespace, ref["name"])
                if secret is None or ref["key"] not in (secret.get("data") or {}):
                    raise LookupError(f'secret "{ref["name"]}" (key {ref["key"]!r}) not found')
                env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        argv = [mapped(str(a)) for a in (container.get("command") or []) + (container.get("args") or [])]
        if not argv:
            raise LookupError("the container has no command: images' entrypoints are not emulated")
        cwd = mapped(container["workingDir"]) if container.get("workingDir") else None
        return argv, env, cwd

    def _set_pod(self, pod: PodRun, phase: str, exit_code: int | None = None, reason: str | None = None,
                 message: str | None = None) -> None:
        with self.cluster.lock:
            pod.phase = phase
            status: dict[str, Any] = {"phase": phase}
            if phase == "Running":
                status["startTime"] = _now()
                status["containerStatuses"] = [{"name": pod.obj["spec"]["containers"][0].get("name", "main"),
                                                "ready": True, "restartCount": 0, "image": "", "imageID": "",
                                                "state": {"running": {"startedAt": _now()}}}]
            if exit_code is not None:
                status["containerStatuses"] = [{"name": pod.obj["spec"]["containers"][0].get("name", "main"),
                                                "ready": False, "restartCount": 0, "image": "", "imageID": "",
                                                "state": {"terminated": {"exitCode": exit_code,
                                                                         "finishedAt": _now()}}}]
            if pod.disruption is not None:  # the condition stays; the kubelet names its eviction
                status["conditions"] = pod.obj["status"].get("conditions") or []
                if phase == "Failed" and pod.disruption == "TerminationByKubelet":
                    reason, message = "Evicted", "The node was low on resource: memory."
            if reason:
                status["reason"], status["message"] = reason, message
            pod.obj["status"] = status
            if not pod.deleted and self.cluster.get("pods", pod.namespace, pod.name) is pod.obj:
                self.cluster.put("pods", pod.namespace, pod.obj)

    def _kill_pod(self, pod: PodRun) -> None:
        """A deleted pod's container stopped as the kubelet stops it (:func:`stop_container`)."""
        pod.deleted = True
        if pod.proc is not None and pod.proc.poll() is None:
            stop_container(pod.proc.pid, self.kill_grace)

    def _remove_pods(self, job: JobRun, wait: bool = False, keep_objects: bool = False) -> None:
        threads = []
        with self.cluster.lock:
            pods = list(job.pods)
        for pod in pods:
            if not keep_objects:
                self.cluster.remove("pods", pod.namespace, pod.name)
            threads.append(threading.Thread(target=self._kill_pod, args=(pod,), daemon=True))
            threads[-1].start()
        for thread in threads:
            thread.join()
        if not keep_objects:
            shutil.rmtree(self.directory / "pod-volumes" / job.namespace / job.name, ignore_errors=True)

    # ---- operators ------------------------------------------------------------------------------

    def _write_status(self, job: JobRun, status: dict[str, Any]) -> None:
        with self.cluster.lock:
            obj = self.cluster.get(job.plural, job.namespace, job.name)
            if obj is not None:
                obj["status"] = status
                self.cluster.put(job.plural, job.namespace, obj)

    def _restart_retryable(self, job: JobRun, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The training-operator's ``restartPolicy: ExitCode``: a replica that failed with a retryable
        exit code (128 or more: killed by a signal, as when Kubernetes stops a pod) is deleted and
        created again, and the job is Restarting (Running False) until its replicas run again."""
        key = KUBEFLOW[job.plural][0]
        failed = [p for p in job.pods if p.phase == "Failed" and (p.exit_code or 0) >= 128
                  and obj["spec"][key][p.role].get("restartPolicy") == "ExitCode"]
        if not failed:
            return None
        status = dict(obj.get("status") or {})
        conditions = [dict(c, status="False") if c["type"] == "Running" and c["status"] == "True" else c
                      for c in status.get("conditions") or []]
        for pod in failed:
            template = obj["spec"][key][pod.role]["template"]
            with self.cluster.lock:
                job.pods.remove(pod)
                self.cluster.remove("pods", pod.namespace, pod.name)
                job.pods.append(self._start_pod(job, obj, pod.role, pod.index, template, _kubeflow_labels(job)))
        roles = sorted({p.role for p in failed})
        status["conditions"] = conditions + [_condition(
            "Restarting", f"{obj['kind']} {job.name} is restarting because {len(failed)} {', '.join(roles)} "
                          "replica(s) failed.", f"{obj['kind']}Restarting")]
        return status

    def _reconcile(self, job: JobRun, obj: dict[str, Any]) -> None:
        phases = [p.phase for p in job.pods]
        restarted = self._restart_retryable(job, obj) if job.plural in KUBEFLOW else None
        if restarted is not None:
            self._write_status(job, restarted)
            return
        if job.plural in KUBEFLOW:
            status = _kubeflow_status(obj, job)
        elif job.plural == "frameworks":
            status = _framework_status(obj, job)
        else:
            status = _adaptdl_status(obj, job, phases)
        if status is None:
            return
        if _finished(job.plural, status):
            job.done = True
            for pod in job.pods:
                if pod.phase in ("Running", "Pending"):
                    self.cluster.remove("pods", pod.namespace, pod.name)
                    threading.Thread(target=self._kill_pod, args=(pod,), daemon=True).start()
        self._write_status(job, status)


def _finished(plural: str, status: dict[str, Any]) -> bool:
    if plural in KUBEFLOW:
        return any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in status["conditions"])
    if plural == "frameworks":
        return status.get("state") == "Completed"
    return status.get("phase") in ("Succeeded", "Failed")


def _kubeflow_labels(job: JobRun) -> dict[str, str]:
    return {"training.kubeflow.org/job-name": job.name,
            "training.kubeflow.org/operator-name": KUBEFLOW[job.plural][1]}


def _condition(kind: str, message: str, reason: str | None = None) -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason or f"Job{kind}", "message": message,
            "lastUpdateTime": _now(), "lastTransitionTime": _now()}


def _kubeflow_status(obj: dict[str, Any], job: JobRun) -> dict[str, Any] | None:
    status = dict(obj.get("status") or {})
    conditions = list(status.get("conditions") or [])
    types = {c["type"] for c in conditions if c["status"] == "True"}
    replica_statuses: dict[str, dict[str, int]] = {}
    for pod in job.pods:
        counts = replica_statuses.setdefault(pod.role, {"active": 0, "succeeded": 0, "failed": 0})
        key = {"Running": "active", "Succeeded": "succeeded", "Failed": "failed"}.get(pod.phase)
        if key:
            counts[key] += 1
    status["replicaStatuses"] = replica_statuses
    leaders = [p for p in job.pods if p.role.lower() in ("chief", "master")]
    deciders = leaders or [p for p in job.pods if p.role.lower() == "worker"] or job.pods
    failed = [p for p in job.pods if p.phase == "Failed"]
    new: dict[str, Any] | None = None
    if failed:
        pod = failed[0]
        new = _condition("Failed", f"{obj['kind']} {job.name} has failed because {pod.role} replica(s) failed "
                                   f"(pod {pod.name} exited with code {pod.exit_code}).")
    elif all(p.phase == "Succeeded" for p in deciders):
        new = _condition("Succeeded", f"{obj['kind']} {job.name} successfully completed.")
    elif "Running" not in types and all(p.phase in ("Running", "Succeeded") for p in job.pods):
        new = _condition("Running", f"{obj['kind']} {job.name} is running.")
    if new is None:
        return status if status != obj.get("status") else None
    for c in conditions:  # one of Running and Restarting holds at a time
        if c["type"] in ("Running", "Restarting") and c["status"] == "True":
            c["status"] = "False"
    if new["type"] != "Running":
        status["completionTime"] = _now()
    status["conditions"] = conditions + [new]
    return status


def _framework_completed(obj: dict[str, Any], code: int, phrase: str, kind: str, attribute: str | None,
                         diagnostics: str) -> dict[str, Any]:
    status = dict(obj.get("status") or {})
    completion = {"code": code, "phrase": phrase, "diagnostics": diagnostics,
                  "type": {"name": kind, "attributes": [attribute] if attribute else []}}
    status.update({"state": "Completed", "completionTime": _now(), "transitionTime": _now(),
                   "attemptStatus": {**(status.get("attemptStatus") or {}), "completionStatus": completion,
                                     "completionTime": _now()}})
    return status


def _framework_status(obj: dict[str, Any], job: JobRun) -> dict[str, Any] | None:
    status = dict(obj.get("status") or {})
    roles = {r["name"]: r for r in obj["spec"]["taskRoles"]}
    for name, role in roles.items():
        pods = [p for p in job.pods if p.role == name]
        policy = role.get("frameworkAttemptCompletionPolicy") or {"minFailedTaskCount": 1,
                                                                   "minSucceededTaskCount": -1}
        failed = [p for p in pods if p.phase == "Failed"]
        succeeded = [p for p in pods if p.phase == "Succeeded"]
        if policy["minFailedTaskCount"] != -1 and len(failed) >= policy["minFailedTaskCount"]:
            code = failed[0].exit_code or 1
            attribute = {200: "Transient", 201: "Transient", 210: "Permanent"}.get(code, "Permanent")
            return _framework_completed(obj, code, "ContainerFailed", "Failed", attribute,
                                        f"task {failed[0].name} of role {name} exited with code {code}")
        if policy["minSucceededTaskCount"] != -1 and len(succeeded) >= policy["minSucceededTaskCount"]:
            return _framework_completed(obj, 0, "Succeeded", "Succeeded", None,
                                        f"{len(succeeded)} task(s) of role {name} succeeded")
    if all(p.phase in ("Succeeded", "Failed") for p in job.pods):
        return _framework_completed(obj, 0, "Succeeded", "Succeeded", None, "all tasks completed")
    state = "AttemptRunning" if all(p.phase != "Pending" for p in job.pods) else "AttemptPreparing"
    if status.get("state") == state:
        return None
    status.update({"state": state, "transitionTime": _now()})
    return status


def _adaptdl_status(obj: dict[str, Any], job: JobRun, phases: list[str]) -> dict[str, Any] | None:
    status = dict(obj.get("status") or {})
    new: dict[str, Any]
    if "Failed" in phases:
        new = {"phase": "Failed", "reason": "PodFailure",
               "message": f"pod {job.pods[phases.index('Failed')].name} failed", "completionTimestamp": _now()}
    elif phases and all(p == "Succeeded" for p in phases):
        new = {"phase": "Succeeded", "completionTimestamp": _now()}
    elif phases and all(p in ("Running", "Succeeded") for p in phases):
        new = {"phase": "Running"}
    else:
        new = {"phase": "Starting"}
    new.update({"replicas": len(phases), "readyReplicas": phases.count("Running"), "group": 0})
    if all(status.get(k) == v for k, v in new.items()):
        return None
    status.update(new)
    return status


def _operator_env(job: JobRun, obj: dict[str, Any], rtype: str, index: int) -> dict[str, str]:
    if job.plural == "pytorchjobs":
        world = sum(int(s.get("replicas", 1)) for s in obj["spec"]["pytorchReplicaSpecs"].values())
        rank = index if rtype.lower() == "master" else index + (1 if "Master" in obj["spec"]["pytorchReplicaSpecs"]
                                                                   else 0)
        return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456", "WORLD_SIZE": str(world), "RANK": str(rank),
                "PYTHONUNBUFFERED": "1"}
    if job.plural == "tfjobs":
        import json

        return {"TF_CONFIG": json.dumps({"cluster": {}, "task": {"type": rtype.lower(), "index": index}})}
    if job.plural == "frameworks":
        return {"FC_FRAMEWORK_NAME": job.name, "FC_TASKROLE_NAME": rtype, "FC_TASK_INDEX": str(index),
                "FC_FRAMEWORK_ATTEMPT_ID": "0"}
    return {"ADAPTDL_JOB_ID": f"{job.namespace}/{job.name}", "ADAPTDL_NUM_REPLICAS": "1",
            "ADAPTDL_REPLICA_RANK": str(index)}


def _framework_barrier(container: dict[str, Any], volumes: dict[str, Path], pod: PodRun) -> None:
    """The frameworkbarrier init container: writes ``injector.sh`` exporting the peers' addresses."""
    for mount in container.get("volumeMounts") or []:
        target = volumes.get(mount["name"])
        if target is not None:
            role = pod.role.upper().replace("-", "_")
            (target / "injector.sh").write_text(f"export FB_{role}_ADDRESSES=127.0.0.1\n")
