"""Reuse-mode worker: one long-lived process per machine and experiment that starts trial after
trial without a new SSH session or code extraction per trial (standard library only).

``python -S -m trialflow.trial.worker <env dir> [<idle timeout seconds>]`` forks a worker into its
own session and returns at once; when a live worker already serves ``<env dir>`` it only clears a
pending stop request and leaves. The environment directory holds:

* ``worker.json``: ``{"pid", "start_time", "version"}`` of the live worker (the controller checks
  the version against its own);
* ``queue/<trial id>.json``: launch payloads (see ``keeper.write_trial_files``) written atomically
  by the controller; the worker moves each to ``taken/``, writes the trial's files and starts its
  keeper, which runs the trial detached, so trials outlive the worker; then it notes that keeper's
  ``{"pid", "start_time", "version"}`` in ``taken/<trial id>.keeper`` (a trial whose files are gone
  after that is lost, and that keeper is the one to stop);
* ``heartbeat``: touched by the controller; with no touch for the idle timeout the worker leaves;
* ``stop``: ask the worker to leave (the controller's ``close()``);
* ``kill/<trial id>``: stop that trial (the file holds its directory); used where the controller
  cannot run a command next to the worker (a cluster job's pod).

A relative ``trial_dir`` in a payload is relative to ``<env dir>`` (shared storage, where the
controller and the pod see different paths). ``worker --foreground <env dir> [idle]`` serves in
the calling process: a cluster job's pod, which ends when the worker leaves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from .keeper import claim, kill_trial, process_record, write_trial_files
from .procs import daemonize, pid_alive, read_json, write_atomic
from .protocol import HEARTBEAT, KEEPER_NOTE, KILL, META_DIR, QUEUE, STOP, TAKEN, WORKER_IDLE_TIMEOUT, WORKER_INFO

TICK = 0.02
KILL_GRACE = 2.0


def _live_worker(env_dir: str) -> bool:
    info = read_json(os.path.join(env_dir, WORKER_INFO))
    return info is not None and pid_alive(int(info["pid"]), info.get("start_time"))


def serve(env_dir: str, idle_timeout: float) -> None:
    queue, taken = os.path.join(env_dir, QUEUE), os.path.join(env_dir, TAKEN)
    os.makedirs(queue, exist_ok=True)
    os.makedirs(taken, exist_ok=True)
    write_atomic(os.path.join(env_dir, WORKER_INFO), process_record(os.getpid()))
    heartbeat = os.path.join(env_dir, HEARTBEAT)
    keepers: list[subprocess.Popen[bytes]] = []
    while True:
        if os.path.exists(os.path.join(env_dir, STOP)):
            break
        try:
            last = os.stat(heartbeat).st_mtime
        except OSError:
            last = os.stat(os.path.join(env_dir, WORKER_INFO)).st_mtime
        if time.time() - last > idle_timeout:
            break
        for name in sorted(os.listdir(queue)):
            if name.endswith(".json"):
                keepers.extend(_take(env_dir, os.path.join(queue, name), os.path.join(taken, name)))
        _kill_requests(env_dir)
        keepers = [k for k in keepers if k.poll() is None]
        time.sleep(TICK)
    try:
        os.remove(os.path.join(env_dir, WORKER_INFO))
    except OSError:
        pass


def _kill_requests(env_dir: str) -> None:
    kills = os.path.join(env_dir, KILL)
    if not os.path.isdir(kills):
        return
    for name in os.listdir(kills):
        if ".tmp" in name:
            continue  # still being written (write_atomic renames it into place)
        path = os.path.join(kills, name)
        try:
            with open(path, encoding="utf-8") as f:
                trial_dir = os.path.normpath(os.path.join(env_dir, f.read().strip()))
            os.remove(path)
        except OSError:
            continue
        threading.Thread(target=kill_trial, args=(trial_dir, KILL_GRACE), daemon=True).start()


def _take(env_dir: str, queued: str, taken: str) -> list[subprocess.Popen[bytes]]:
    payload = read_json(queued)
    try:
        os.replace(queued, taken)
    except OSError:
        return []
    if payload is None:
        return []
    payload["trial_dir"] = os.path.normpath(os.path.join(env_dir, payload["trial_dir"]))
    trial_dir = write_trial_files(payload)
    if not claim(trial_dir):
        return []
    log = open(os.path.join(trial_dir, META_DIR, "keeper.log"), "ab")  # noqa: SIM115 -- handed to the child
    try:
        proc = subprocess.Popen([sys.executable, "-S", "-m", "trialflow.trial.keeper", trial_dir],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    finally:
        log.close()
    try:
        write_atomic(taken[: -len(".json")] + KEEPER_NOTE, process_record(proc.pid))
    except OSError:
        pass  # a full disk: the trial runs unnoted (lost, it then reads as still queued)
    return [proc]


def start(env_dir: str, idle_timeout: float) -> int:
    """Fork a worker for ``env_dir`` unless one is running; return at once."""
    os.makedirs(env_dir, exist_ok=True)
    try:
        os.remove(os.path.join(env_dir, STOP))
    except FileNotFoundError:
        pass
    if _live_worker(env_dir) or daemonize(os.path.join(env_dir, "worker.log")) != 0:
        return 0
    code = 0
    try:
        serve(env_dir, idle_timeout)
    except BaseException as exc:  # noqa: BLE001 -- a daemon reports and leaves
        print(f"trialflow worker stopped: {exc!r}", file=sys.stderr, flush=True)
        code = 1
    os._exit(code)


def main(argv: list[str]) -> int:
    foreground = argv[:1] == ["--foreground"]
    argv = argv[1:] if foreground else argv
    if len(argv) not in (1, 2):
        print("usage: worker [--foreground] <env dir> [idle timeout seconds]", file=sys.stderr)
        return 2
    idle = float(argv[1]) if len(argv) == 2 else WORKER_IDLE_TIMEOUT
    if foreground:
        os.makedirs(argv[0], exist_ok=True)
        serve(os.path.abspath(argv[0]), idle)
        return 0
    return start(argv[0], idle)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
