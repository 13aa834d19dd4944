"""``trialflow tensorboard start|stop`` (NNI's ``nnictl tensorboard``): one TensorBoard per
experiment over its trials' ``$NNI_OUTPUT_DIR/tensorboard`` folders, one run per trial.

Lifecycle: :func:`start` gathers the folders through the experiment's training service (local and
shared-storage trials are read where they are; remote trials are copied here over SFTP, a snapshot
as of the start), launches ``tensorboard`` (:mod:`trialflow.presentation.tensorboard_own_user`: on
loopback, for this user's connections only) in its own session on 127.0.0.1 by default, waits until
it answers HTTP and records it in ``<experiment dir>/tensorboard/server.json``; it keeps serving after
the command returns. :func:`stop` ends that process group and forgets it. Needs the ``tensorboard``
extra (``pip install 'trialflow[tensorboard]'``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from ..foundation.user_errors import UserError
from ..platforms import PlatformError, TrainingService, TrialHandle
from ..records.store import ExperimentStore
from ..trial.procs import (
    group_alive,
    kill_group,
    pid_alive,
    process_start_time,
    read_json,
    with_this_trialflow,
    write_atomic,
)

FOLDER = "tensorboard"  # under each trial's NNI_OUTPUT_DIR, as NNI
STATE = "server.json"
START_TIMEOUT = 90.0
_URL = re.compile(r"(https?://[^\s/]+:\d+/)")


class TensorBoardError(UserError, RuntimeError):
    """TensorBoard cannot start or stop; the message says why and what to do."""


@dataclass(frozen=True)
class TensorBoardServer:
    url: str
    pid: int
    runs: dict[str, str]  # trial id -> log folder


def _state_path(exp_dir: Path) -> Path:
    return exp_dir / FOLDER / STATE


def running_server(exp_dir: Path) -> TensorBoardServer | None:
    """The experiment's TensorBoard while its process lives."""
    state = read_json(str(_state_path(exp_dir)))
    if not state:
        return None
    if not pid_alive(state["pid"], state.get("start_time")):
        return None
    return TensorBoardServer(state["url"], state["pid"], state["runs"])


def trial_folders(store: ExperimentStore, service: TrainingService, trial_ids: list[str] | None
                  ) -> dict[str, str]:
    """Trial id -> local TensorBoard folder, for the chosen trials (default: all that were submitted)."""
    trials = {t.id: t for t in store.trials()}
    unknown = sorted(set(trial_ids or []) - set(trials))
    if unknown:
        raise TensorBoardError(f"no trial {', '.join(unknown)} in experiment {store.experiment_id} "
                               "(see `trialflow trial ls`)")
    runs = {}
    for trial_id in trial_ids or list(trials):
        handle = trials[trial_id].handle
        if handle is None:
            continue  # never submitted: nothing written
        try:
            folder = service.output_folder(TrialHandle.from_dict(handle), FOLDER)
        except PlatformError as exc:
            raise TensorBoardError(f"cannot reach the {FOLDER} folder of trial {trial_id}: {exc}") from None
        if folder is not None and folder.is_dir():
            runs[trial_id] = str(folder)
    if not runs:
        raise TensorBoardError(f"no trial of experiment {store.experiment_id} wrote a {FOLDER} folder: trials "
                               f"write TensorBoard logs under os.path.join(os.environ['NNI_OUTPUT_DIR'], '{FOLDER}')")
    return runs


def start(exp_dir: Path, runs: dict[str, str], port: int = 6006, host: str = "127.0.0.1") -> TensorBoardServer:
    """Serve ``runs`` (name -> folder) with TensorBoard; ``port`` 0 picks a free port."""
    if importlib.util.find_spec("tensorboard") is None:
        raise TensorBoardError("tensorboard is not installed: pip install 'trialflow[tensorboard]'")
    serving = running_server(exp_dir)
    if serving is not None:
        raise TensorBoardError(f"a TensorBoard of this experiment already serves at {serving.url}; "
                               f"`trialflow tensorboard stop {exp_dir.name}` first")
    folder = exp_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    # TensorBoard writes pid-<pid>.info into <temporary directory>/.tensorboard-info, a folder it leaves
    # open to all (0777, no sticky bit), following links: in the shared /tmp another user could link
    # those names to this user's files. Its temporary directory is this experiment's own instead.
    private = folder / "tmp"
    private.mkdir(exist_ok=True)
    private.chmod(0o700)
    log_path = folder / "tensorboard.log"
    spec = ",".join(f"{name}:{path}" for name, path in sorted(runs.items()))
    args = [sys.executable, "-m", "trialflow.presentation.tensorboard_own_user", "--logdir_spec", spec,
            "--host", host, "--port", str(port)]
    env = with_this_trialflow({**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(private)})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                env=env)
    try:
        url = _wait_until_serving(proc, log_path)
    except BaseException:
        kill_group(proc.pid, 1.0)
        raise
    write_atomic(str(_state_path(exp_dir)), {"pid": proc.pid, "start_time": process_start_time(proc.pid),
                                             "url": url, "runs": runs})
    return TensorBoardServer(url, proc.pid, runs)


def _wait_until_serving(proc: subprocess.Popen[bytes], log_path: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise TensorBoardError(f"tensorboard exited with code {proc.returncode}: {' | '.join(tail)}")
        found = _URL.search(log_path.read_text(errors="replace"))
        if found:
            try:
                if requests.get(found.group(1), timeout=2).ok:
                    return found.group(1)
            except requests.RequestException:
                pass
        time.sleep(0.2)
    raise TensorBoardError(f"tensorboard did not answer within {START_TIMEOUT:.0f} s; see {log_path}")


def stop(exp_dir: Path) -> TensorBoardServer:
    """End the experiment's TensorBoard (its whole process group)."""
    server = running_server(exp_dir)
    _state_path(exp_dir).unlink(missing_ok=True)
    if server is None:
        raise TensorBoardError(f"no TensorBoard of experiment {exp_dir.name} is running")
    kill_group(server.pid, 3.0)
    if group_alive(server.pid):
        raise TensorBoardError(f"TensorBoard (pid {server.pid}) did not stop")
    return server
