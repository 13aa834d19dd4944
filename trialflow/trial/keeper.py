"""Trial keeper: runs one trial command detached from the controller and records how it ended.

Started as ``python -m trialflow.trial.keeper <trial dir>`` in a new session (so it is the process
group leader and outlives the controller or the SSH session that started it). Standard library only.

Files in ``<trial dir>/.nni/`` (written atomically):
* ``keeper.json`` (input): ``{"command", "cwd", "env"}``;
* ``started``: ``{"pid", "time"}`` once the command runs;
* ``state``: ``{"exit_code", "end_time"}`` when it ends (exit code ``128 + n`` for signal ``n``).
The trial's output goes to ``trial.stdout`` / ``trial.stderr`` in the trial dir. The keeper ignores
SIGINT/SIGTERM so it can record the exit of a trial being stopped; the controller kills the whole
process group, keeper included, with SIGKILL at the end of the grace period.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def write_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run(trial_dir: str) -> int:
    meta_dir = os.path.join(trial_dir, ".nni")
    with open(os.path.join(meta_dir, "keeper.json"), encoding="utf-8") as f:
        spec = json.load(f)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    env = {**os.environ, **spec.get("env", {})}
    with open(os.path.join(trial_dir, "trial.stdout"), "ab") as out, \
            open(os.path.join(trial_dir, "trial.stderr"), "ab") as err:
        try:
            proc = subprocess.Popen(["/bin/bash", "-c", spec["command"]], cwd=spec.get("cwd") or trial_dir,
                                    env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    preexec_fn=_default_signals)
        except OSError as exc:
            err.write(f"trialflow keeper: cannot start the trial command: {exc}\n".encode())
            write_atomic(os.path.join(meta_dir, "state"), {"exit_code": 127, "end_time": time.time()})
            return 127
        write_atomic(os.path.join(meta_dir, "started"), {"pid": proc.pid, "time": time.time()})
        code = proc.wait()
    exit_code = 128 - code if code < 0 else code
    write_atomic(os.path.join(meta_dir, "state"), {"exit_code": exit_code, "end_time": time.time()})
    return 0


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
