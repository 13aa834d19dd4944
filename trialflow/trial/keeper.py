"""Trial keeper: runs one trial command detached from the controller and records how it ended.

Standard library only; it travels to every worker with the trial runtime. Forms:

* ``python -S -m trialflow.trial.keeper <trial dir>``: run the trial (the caller made this process
  a session leader, e.g. ``start_new_session``);
* ``... keeper --detach <trial dir> [<gpu indices>]``: fork a keeper into its own session and return at
  once (used over SSH, so the trial survives the SSH session and a dropped connection); the
  optional ``0,1`` sets ``CUDA_VISIBLE_DEVICES``; prints the keeper's pid (:func:`say_keeper`);
* ``... keeper --submit``: read a launch payload (JSON, see :func:`write_trial_files`) on stdin,
  write the trial directory and, unless the payload says ``hold``, detach a keeper and print its pid
  -- one SSH command per trial;
* ``... keeper --kill <trial dir> <grace seconds>``: stop the trial's whole process group
  (SIGINT, SIGTERM, SIGKILL); a trial that already ended is not an error;
* ``... keeper --stop-group <keeper pid> <start time> <grace seconds>``: stop the process group of a
  keeper whose trial directory is gone (see :func:`stop_lost_group`); prints ``stopped`` when it ran;
* ``... keeper --never-start <trial dir>``: a trial whose keeper has not started never will (a batch job
  cancelled before it ran; see :func:`never_start`);
* ``... keeper --mark-stop <trial dir>``: write ``stop_sent`` when the trial's files say it runs (see
  :func:`mark_stop`), before a stop that signals where the trial cannot be looked at (Slurm's ``scancel``);
* ``... keeper --pod <trial dir> <role> <primary role> [<attempt>]``: a cluster job's replica, in the foreground
  (see :func:`pod`); paths in a ``located`` ``keeper.json`` are relative to the trial directory;
* ``... keeper --batch <trial dir> <attempt>``: a batch job's run of the trial (Slurm), in the foreground
  (see :func:`batch`);
* ``... keeper --version``: print the runtime's version.

Files in ``<trial dir>/.nni/`` (written atomically):
* ``keeper.json`` (input): ``{"command", "cwd", "env"}``;
* ``keeper.lock``: created exclusively by the one keeper allowed to start (so retried or repeated
  launches never run a trial twice);
* ``keeper.pid``: ``{"pid", "start_time", "version"}`` of the keeper (= process group id);
* ``started``: ``{"pid", "time", "start_time"}`` once the command runs;
* ``stop_sent``: ``{"time"}``, written by trialflow's stop (``--kill``, the local platform's cancel: both
  :func:`stop_group`; Slurm's cancel: :func:`mark_stop`) just before its first signal when it finds the trial
  still running;
* ``state``: ``{"exit_code", "end_time"}`` when it ends (exit code ``128 + n`` for signal ``n``), and
  ``"stop_signal": true`` when a stop reached the trial while it still ran -- whatever code it then
  exited with answered the stop; on a full disk the keeper waits until it can write it. For trialflow's
  own kill, "still ran" is ``stop_sent``, checked by the sender before it signals (the keeper may get
  the processor only after the trial has answered). For a stop signal from elsewhere it is as the keeper
  finds it when it takes the signal: a trial already exited by then keeps its own code, whether it
  ended by itself or answered that signal within the keeper's reaction time.
The trial's output goes to ``trial.stdout`` / ``trial.stderr`` in the trial dir. The keeper survives
SIGINT/SIGTERM (it notes them) so it can record the exit of a trial being stopped; ``--kill`` ends the
whole group, keeper included, with SIGKILL at the end of the grace period.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from .procs import daemonize, kill_group, pid_alive, process_start_time, read_json, write_atomic, write_when_space
from .protocol import (
    CHECKPOINT_DIR,
    CHECKPOINT_ENV,
    KEEPER_LOCK,
    KEEPER_PID,
    KEEPER_SPEC,
    META_DIR,
    PARAMETER_FILE,
    STARTED,
    STATE,
    STDERR_FILE,
    STDOUT_FILE,
    STOP_SENT,
)

__all__ = ["assign_gpus", "batch", "claim", "execute", "kill_trial", "mark_stop", "never_start", "pod",
           "process_record", "run", "runtime_version", "stop_group", "write_atomic", "write_trial_files"]


def runtime_version() -> str:
    from .. import __version__

    return __version__


def process_record(pid: int) -> dict:
    """What ``keeper.pid`` (and a worker's info) says of the process ``pid``: its pid, its start time (a pid
    plus its start time names one process for good) and the trialflow version it runs."""
    return {"pid": pid, "start_time": process_start_time(pid), "version": runtime_version()}


def run(trial_dir: str) -> int:
    """Run the trial of ``trial_dir`` and record its end; the keeper itself exits 0."""
    execute(trial_dir)
    return 0


def _located(trial_dir: str, spec: dict) -> tuple[str, dict]:
    """cwd and env of a spec; a ``located`` spec (written for shared storage, where the controller and
    the pod see different paths) gets its directories from where the trial directory really is."""
    cwd = os.path.normpath(os.path.join(trial_dir, spec.get("cwd") or "."))
    env = dict(spec.get("env", {}))
    if spec.get("located"):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env.update({"NNI_SYS_DIR": trial_dir, "NNI_OUTPUT_DIR": trial_dir, "NNI_CODE_DIR": cwd,
                    CHECKPOINT_ENV: os.path.join(trial_dir, CHECKPOINT_DIR),
                    "PYTHONPATH": os.pathsep.join([os.path.join(root, "trialflow", "trial", "nni_shim"), root])})
    return cwd, env


def execute(trial_dir: str, tee: bool = False) -> int:
    """Run the trial command and write ``state``; returns the trial's exit code. ``tee`` (a pod's
    keeper) also copies the trial's output to this process's stdout/stderr (the pod's log) and passes
    a stop signal on to the trial: a container runtime signals the container's first process only, so
    the trial may save its work before the kill that follows."""
    trial_dir = os.path.abspath(trial_dir)
    meta_dir = os.path.join(trial_dir, META_DIR)
    with open(os.path.join(meta_dir, KEEPER_SPEC), encoding="utf-8") as f:
        spec = json.load(f)
    stop_signals: list[int] = []  # the stop signals that reached the trial (the keeper outlives them)
    trial: list[subprocess.Popen] = []

    def note_stop(received: int, _frame: object) -> None:
        # a signal that finds the trial already exited did not reach it: that trial ended by itself,
        # even though the keeper had not yet seen its end (a busy machine widens that window)
        if not trial or pid_alive(trial[0].pid):  # a zombie counts as exited
            stop_signals.append(received)
            if tee and trial:
                try:
                    trial[0].send_signal(received)
                except OSError:
                    pass

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, note_stop)
    write_atomic(os.path.join(meta_dir, KEEPER_PID), process_record(os.getpid()))
    cwd, spec_env = _located(trial_dir, spec)
    if spec_env.get(CHECKPOINT_ENV):  # the trial's own, kept across its runs
        os.makedirs(spec_env[CHECKPOINT_ENV], exist_ok=True)
    env = {**os.environ, **spec_env}
    # bash sources ~/.bashrc when it sees it was started over SSH; that would reorder PATH (pythonPath
    # first, as NNI promises) and cost a shell start-up per trial. The trial command runs rc-free.
    for name in ("SSH_CLIENT", "SSH2_CLIENT"):
        env.pop(name, None)
    pipe = subprocess.PIPE if tee else None
    with open(os.path.join(trial_dir, STDOUT_FILE), "ab") as out, \
            open(os.path.join(trial_dir, STDERR_FILE), "ab") as err:
        try:
            proc = subprocess.Popen(["/bin/bash", "-c", spec["command"]], cwd=cwd, env=env,
                                    stdout=pipe or out, stderr=pipe or err, stdin=subprocess.DEVNULL,
                                    preexec_fn=_default_signals)
        except OSError as exc:
            err.write(f"trialflow keeper: cannot start the trial command: {exc}\n".encode())
            write_atomic(os.path.join(meta_dir, STATE), {"exit_code": 127, "end_time": time.time()})
            return 127
        trial.append(proc)
        write_when_space(os.path.join(meta_dir, STARTED), {"pid": proc.pid, "time": time.time(),
                                                           "start_time": process_start_time(proc.pid)})
        copiers = [_tee(proc.stdout, out, sys.stdout), _tee(proc.stderr, err, sys.stderr)] if tee else []
        code = proc.wait()
        # a stop reached the trial while it ran (one of ours says so in stop_sent): its exit answered it
        stopped = bool(stop_signals) or os.path.exists(os.path.join(meta_dir, STOP_SENT))
        for copier in copiers:
            copier.join()
    exit_code = 128 - code if code < 0 else code
    state: dict[str, object] = {"exit_code": exit_code, "end_time": time.time()}
    if stopped:
        state["stop_signal"] = True
    # on a full disk the keeper outlives its trial until the end is recorded (the trial reads RUNNING)
    write_when_space(os.path.join(meta_dir, STATE), state)
    return exit_code


def _tee(source, sink, also) -> threading.Thread:  # type: ignore[no-untyped-def]
    def copy() -> None:
        fd = source.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            sink.write(chunk)
            sink.flush()
            also.buffer.write(chunk)
            also.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def pod(trial_dir: str, role: str, primary: str, attempt: int | None = None) -> int:
    """A replica of a cluster job (foreground; the pod's exit code is the command's). The first
    replica of the primary role to claim the trial runs the trial itself; other replicas run their
    role's command beside it, in ``replicas/<pod name>/``, reporting nothing. A replica of a job made
    for run ``attempt`` of the trial runs nothing once a later run took the trial directory over; the
    primary replica created again in place (its pod name holds the claim, or the job has that one
    primary replica: ``sole_primary``) runs nothing and exits 1, a code no operator retries: the
    trial's run was stopped, it runs again only as a new job."""
    trial_dir = os.path.abspath(trial_dir)
    meta, spec = _meta_and_spec(trial_dir)
    try:
        if _taken_over(spec, attempt, "replica"):
            return 0
        host = os.environ.get("HOSTNAME", "")
        claimed = role == primary and meta is not None and claim(trial_dir, host, meta_fd=meta)
        if role == primary and not claimed and (spec.get("sole_primary") or (host and meta is not None
                                                                             and _claimed_by(meta) == host)):
            print("trialflow: this pod ran the trial before it was stopped; the trial runs again only as a new job",
                  file=sys.stderr)
            return 1
    finally:
        if meta is not None:
            os.close(meta)
    if claimed:
        return execute(trial_dir, tee=True)
    command = (spec.get("roles") or {}).get(role) or spec.get("command", "true")
    replica_dir = os.path.join(trial_dir, "replicas", os.environ.get("HOSTNAME") or str(os.getpid()))
    os.makedirs(replica_dir, exist_ok=True)
    shutil.copyfile(os.path.join(trial_dir, PARAMETER_FILE), os.path.join(replica_dir, PARAMETER_FILE))
    cwd, env = _located(trial_dir, spec)
    env.update({"NNI_SYS_DIR": replica_dir, "NNI_OUTPUT_DIR": replica_dir, "TRIALFLOW_METRIC_CHANNEL": "file"})
    code = subprocess.call(["/bin/bash", "-c", command], cwd=cwd, env={**os.environ, **env},
                           stdin=subprocess.DEVNULL)
    return 128 - code if code < 0 else code


def batch(trial_dir: str, attempt: int) -> int:
    """A batch job's run of the trial (Slurm), in the foreground: the trial runs once, in the job made
    for run ``attempt``. A job whose trial a later run took over runs nothing, nor does a job run again
    by its scheduler (a requeue) once an earlier run of it started the trial; both exit 0. Otherwise the
    exit code is the keeper's (0: the trial's own is in ``state``)."""
    trial_dir = os.path.abspath(trial_dir)
    meta, spec = _meta_and_spec(trial_dir)
    try:
        if _taken_over(spec, attempt, "job"):
            return 0
        if meta is None or not claim(trial_dir, os.environ.get("SLURM_JOB_ID", ""), meta_fd=meta):
            print("trialflow: this trial was started by an earlier run of this job; not twice", file=sys.stderr)
            return 0
    finally:
        if meta is not None:
            os.close(meta)
    return run(trial_dir)


def _meta_and_spec(trial_dir: str) -> tuple[int | None, dict]:
    """The trial's meta directory, open (None when missing; the caller closes it), and the keeper spec
    in it ({} when missing): the spec is read and the claim made in one directory, even if a later run
    moves it aside meanwhile."""
    try:
        meta = os.open(os.path.join(trial_dir, META_DIR), os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None, {}
    return meta, read_json(KEEPER_SPEC, dir_fd=meta) or {}


def _taken_over(spec: dict, attempt: int | None, runner: str) -> bool:
    """Whether a later run of the trial took its directory over from run ``attempt`` (said on stderr,
    naming the ``runner`` that then runs nothing)."""
    if attempt is None or (spec and int(spec.get("attempt", 0)) == attempt):
        return False
    taker = f"run {spec['attempt']}" if spec else "a later run (its spec is not written yet)"
    print(f"trialflow: {taker} of this trial took over from run {attempt}; this {runner} runs nothing",
          file=sys.stderr)
    return True


def write_trial_files(payload: dict) -> str:
    """Create the trial directory from a launch payload ``{"trial_dir", "parameter", "keeper"}``:
    ``parameter.cfg`` and ``.nni/keeper.json``. Returns the trial directory."""
    trial_dir = payload["trial_dir"]
    os.makedirs(os.path.join(trial_dir, META_DIR), exist_ok=True)
    write_atomic(os.path.join(trial_dir, PARAMETER_FILE), payload["parameter"])
    write_atomic(os.path.join(trial_dir, META_DIR, KEEPER_SPEC), payload["keeper"])
    return trial_dir


def claim(trial_dir: str, owner: str = "", meta_fd: int | None = None) -> bool:
    """True for the one caller allowed to start this trial's keeper; ``owner`` (a pod's name) is
    written into the claim, made in the open meta directory ``meta_fd`` when given."""
    try:
        lock = KEEPER_LOCK if meta_fd is not None else os.path.join(trial_dir, META_DIR, KEEPER_LOCK)
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, dir_fd=meta_fd)
    except FileExistsError:
        return False
    try:
        os.write(fd, owner.encode())
    finally:
        os.close(fd)
    return True


def _claimed_by(meta_fd: int) -> str:
    try:
        with open(KEEPER_LOCK, encoding="utf-8", errors="replace",
                  opener=lambda name, flags: os.open(name, flags, dir_fd=meta_fd)) as f:
            return f.read()
    except OSError:
        return ""


def assign_gpus(spec: dict, gpus: list[int]) -> dict:
    """Give a keeper spec (``keeper.json``) its GPUs: ``CUDA_VISIBLE_DEVICES`` and ``gpus``."""
    spec.setdefault("env", {})["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    spec["gpus"] = list(gpus)
    return spec


def set_gpus(trial_dir: str, gpus: str) -> None:
    path = os.path.join(trial_dir, META_DIR, KEEPER_SPEC)
    write_atomic(path, assign_gpus(read_json(path) or {}, [int(g) for g in gpus.split(",") if g]))


def detach(trial_dir: str) -> int:
    """Fork a keeper that leads its own session; the caller returns at once, with the keeper's pid. The
    keeper claims the trial only once it is detached: a submitting process killed before that (its SSH
    session torn down) leaves no claim behind, so the retried submission starts the trial instead of
    finding it claimed by nobody. A trial whose keeper was already started is left alone (the keeper
    forked then ends at once)."""
    pid = daemonize(os.path.join(trial_dir, META_DIR, "keeper.log"))
    if pid != 0:
        return pid
    try:
        code = run(trial_dir) if claim(trial_dir) else 0
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def never_start(trial_dir: str) -> bool:
    """Make sure a trial whose keeper has not started never will, its end recorded as never started;
    True when so, False when a keeper already claimed it or the trial has no meta directory."""
    meta_dir = os.path.join(trial_dir, META_DIR)
    if not os.path.isdir(meta_dir) or not claim(trial_dir):
        return False
    write_atomic(os.path.join(meta_dir, STATE), {"exit_code": None, "end_time": time.time(), "never_started": True})
    return True


def mark_stop(trial_dir: str) -> bool:
    """Write ``stop_sent`` when the trial's files say it runs (``started``, and no ``state`` yet), for a
    stop about to be signalled where its process cannot be looked at (a compute node: Slurm's ``scancel``
    signals the keeper and the trial at once, and the trial may exit before its keeper notes the signal).
    A trial that ends meanwhile by itself then reads as stopped unless it exited 0 (a success stands).
    True when written; an unwritable mark (a full disk) is False, and the stop goes ahead unmarked."""
    meta_dir = os.path.join(trial_dir, META_DIR)
    if not os.path.exists(os.path.join(meta_dir, STARTED)) or os.path.exists(os.path.join(meta_dir, STATE)):
        return False
    return _write_stop_sent(meta_dir)


def _write_stop_sent(meta_dir: str) -> bool:
    """Write ``stop_sent`` in ``meta_dir``; False when it cannot be written (a full disk): the stop then goes
    ahead unmarked, and an answer the keeper does not see itself reads as the trial's own exit."""
    try:
        write_atomic(os.path.join(meta_dir, STOP_SENT), {"time": time.time()})
    except OSError:
        return False
    return True


def kill_trial(trial_dir: str, grace: float) -> None:
    """Stop the trial: if its keeper never started, make sure it never will (and record the end);
    otherwise stop its process group unless it already ended (pid checked with its start time), first
    writing ``stop_sent`` when the trial itself still runs, so its exit reads as the stop's."""
    meta_dir = os.path.join(trial_dir, META_DIR)
    os.makedirs(meta_dir, exist_ok=True)
    if never_start(trial_dir):
        return
    deadline = time.monotonic() + 10.0  # a keeper that just won the claim writes its pid at once
    info = read_json(os.path.join(meta_dir, KEEPER_PID))
    while info is None and time.monotonic() < deadline and not os.path.exists(os.path.join(meta_dir, STATE)):
        time.sleep(0.05)
        info = read_json(os.path.join(meta_dir, KEEPER_PID))
    if info and pid_alive(int(info["pid"]), info.get("start_time")):
        stop_group(meta_dir, int(info["pid"]), grace)


def stop_group(meta_dir: str, keeper_pid: int, grace: float) -> None:
    """Stop the process group of the keeper ``keeper_pid`` (see :func:`kill_group`), first writing
    ``stop_sent`` in ``meta_dir`` when the trial itself still runs: however soon the trial answers, and
    however late its keeper gets the processor to note the signal, the exit then reads as the stop's.
    The stops trialflow signals to a whole group go through here (``--kill``, the local platform's
    cancel). A work-pool run's runner signals the keeper alone, which notes the stop before it passes it
    on; a platform's own stop that signals where the trial cannot be looked at (Slurm's ``scancel``) is
    preceded by :func:`mark_stop`."""
    started = read_json(os.path.join(meta_dir, STARTED))
    if started and pid_alive(int(started["pid"]), started.get("start_time")):
        _write_stop_sent(meta_dir)
    kill_group(keeper_pid, grace)


def say_keeper(pid: int) -> int:
    """Print the :func:`process_record` of a keeper just forked by :func:`detach`, as ``keeper.pid`` holds
    it (for ``--detach`` and ``--submit``: the service then knows which group to stop should the trial's
    directory, with its ``keeper.pid``, go before it reads that file). Returns the command's exit code, 0."""
    print(json.dumps(process_record(pid)), flush=True)
    return 0


def stop_lost_group(keeper_pid: int, start_time: int | None, grace: float) -> bool:
    """Stop the process group of the keeper ``keeper_pid`` when that keeper still runs (checked by its
    ``start_time``, so never a group that took the pid later; without one it is left alone), for a trial
    whose directory, and with it every file :func:`kill_trial` reads, is gone. True when the keeper ran
    and its group was stopped."""
    if start_time is None or not pid_alive(keeper_pid, start_time):
        return False
    kill_group(keeper_pid, grace)
    return True


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(runtime_version())
        return 0
    if argv[:1] == ["--detach"] and len(argv) in (2, 3):
        if len(argv) == 3:
            set_gpus(argv[1], argv[2])
        return say_keeper(detach(argv[1]))
    if argv == ["--submit"]:
        payload = json.load(sys.stdin)
        trial_dir = write_trial_files(payload)
        return 0 if payload.get("hold") else say_keeper(detach(trial_dir))
    if argv[:1] == ["--pod"] and len(argv) in (4, 5) and (len(argv) == 4 or argv[4].isdigit()):
        return pod(argv[1], argv[2], argv[3], int(argv[4]) if len(argv) == 5 else None)
    if argv[:1] == ["--batch"] and len(argv) == 3 and argv[2].isdigit():
        return batch(argv[1], int(argv[2]))
    if argv[:1] == ["--never-start"] and len(argv) == 2:
        never_start(argv[1])
        return 0
    if argv[:1] == ["--mark-stop"] and len(argv) == 2:
        mark_stop(argv[1])
        return 0
    if argv[:1] == ["--kill"] and len(argv) == 3:
        kill_trial(argv[1], float(argv[2]))
        return 0
    if argv[:1] == ["--stop-group"] and len(argv) == 4 and argv[1].isdigit() and argv[2].isdigit():
        print("stopped" if stop_lost_group(int(argv[1]), int(argv[2]), float(argv[3])) else "not running")
        return 0
    if len(argv) == 1:
        return run(argv[0])
    print("usage: keeper [--detach] <trial dir> [gpus] | --submit | --pod <trial dir> <role> <primary> [attempt] | "
          "--batch <trial dir> <attempt> | --never-start <trial dir> | --mark-stop <trial dir> | "
          "--kill <trial dir> <grace> | --stop-group <pid> <start time> <grace> | --version",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
