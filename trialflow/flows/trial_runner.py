"""The trial-runner flow of the ``prefect`` platform: one flow run per trial (or reuse environment)
on a work pool. The platform deploys it once per experiment (or uses a deployment the user names) and
creates its runs; the worker runs them wherever the pool runs flows.

Parameters carry no secret: ``command`` (the run script on the shared storage, as the worker sees
it), ``metrics_url`` and ``token_block`` -- the *name* of the Prefect Secret block holding the trial's
metrics token, read here and handed to the trial in ``TRIALFLOW_METRICS_TOKEN``. The flow fails when
the command exits non-zero (the trial's own exit code and stderr are on the shared storage), and a
cancellation by Prefect stops the command as a container runtime stops a container: SIGTERM to a
trial's keeper, which passes it on to the trial once, then up to :data:`STOP_GRACE_SECONDS` for the
trial to save its work and end, then SIGKILL to what is left (:func:`_stop_command`). This flow's process
dying without a word ends the command too (a watchdog process stops the command's session then).

The command's output goes to the run's Prefect logs, line by line, but for its metric records (NNI's
``NNISDK_MEb'...'`` lines); the trial's stdout and stderr also stay on the shared storage, where
trialflow reads metrics and logs. ``trial`` holds the
trial's hyper-parameters, shown with the run; nothing reads them from there.

From its start until its final state is set (a state hook), the flow touches ``heartbeat`` (a file
beside the run script) every :data:`HEARTBEAT_SECONDS`: a run whose worker or infrastructure died
stops beating although Prefect still shows it Running, and the platform ends it as Crashed; a run
slow to report its end (a busy API) keeps beating meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from trialflow.trial.procs import watch_next_child
from trialflow.trial.protocol import META_DIR
from trialflow.trial.records import is_metric_line

HEARTBEAT_SECONDS = 2.0
MAX_LOG_LINE = 10_000  # characters of one output line sent to the run's logs
# how long a stopped command has to end (a trial saving its work) before its session is killed: within
# the 30 s a Prefect process worker gives a cancelled run's process
STOP_GRACE_SECONDS = 20.0


_BEATING: dict[str, threading.Event] = {}  # flow run id -> the event that stops its heartbeat


def _stop_beating(flow: Any, flow_run: Any, state: Any) -> None:
    """State hook: the run's final state is set, its heartbeat stops."""
    beating = _BEATING.pop(str(flow_run.id), None)
    if beating is not None:
        beating.set()


def _beat(path: Path, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            path.touch()
        except OSError:
            pass  # the share is briefly unavailable: the next beat tries again
        stop.wait(HEARTBEAT_SECONDS)


def _log_output(proc: subprocess.Popen[bytes], logger: Any) -> None:
    """The command's output to the run's logs, line by line until it ends, but for its metric records
    (results in NNI's stdout framing: trialflow reads them from the share)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if not is_metric_line(line):
            logger.info(line.decode("utf-8", "replace").rstrip()[:MAX_LOG_LINE])


def _stop_command(proc: subprocess.Popen[bytes], logger: Any, keeper: bool) -> None:
    """Stop the run's command: SIGTERM to a trial's keeper alone (``keeper``), which notes the stop and
    passes it on to the trial once, as a container runtime signals a container's first process; to
    the whole session of any other command. The command then has up to :data:`STOP_GRACE_SECONDS` to
    end (its output is still read: a full pipe would hold it), then what is left of its session is
    killed."""
    try:
        if keeper:
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return

    def drain() -> None:
        try:
            _log_output(proc, logger)
        except Exception:  # noqa: BLE001 -- the run is ending: its last lines are on the share too
            pass

    threading.Thread(target=drain, daemon=True).start()
    try:
        proc.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@flow(name="trialflow-trial", log_prints=False, validate_parameters=True, on_completion=[_stop_beating],
      on_failure=[_stop_beating], on_cancellation=[_stop_beating], on_crashed=[_stop_beating])
def trial_runner(command: list[str], metrics_url: str | None = None, token_block: str | None = None,
                 heartbeat: str | None = None, trial: dict[str, Any] | None = None) -> int:
    env = dict(os.environ)
    if metrics_url:
        env["TRIALFLOW_METRICS_URL"] = metrics_url
    if token_block:
        from prefect.blocks.system import Secret

        block: Any = Secret.load(token_block)  # sync in a sync flow: the block
        env["TRIALFLOW_METRICS_TOKEN"] = str(block.get())
    stop = threading.Event()
    if heartbeat:
        from prefect.runtime import flow_run

        _BEATING[str(flow_run.id)] = stop
        threading.Thread(target=_beat, args=(Path(heartbeat), stop), daemon=True).start()
    logger = get_run_logger()
    # the command runs in a session of its own (a cancel stops its whole tree); a watchdog stops it
    # too when this process dies without a word (SIGKILLed with its worker, out of memory)
    guard = watch_next_child(os.getpid())
    try:
        proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(guard,))
    finally:
        os.close(guard)
    try:
        _log_output(proc, logger)
        code = proc.wait()
    except BaseException:  # cancelled or interrupted: the trial goes with the run
        # a trial's run has its meta folder beside the script (and the heartbeat); a reuse environment's has none
        _stop_command(proc, logger, keeper=heartbeat is not None and (Path(heartbeat).parent / META_DIR).is_dir())
        raise
    if code != 0:
        raise RuntimeError(f"the trial's command exited with code {code}")
    return code
