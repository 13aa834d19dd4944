"""The trial-runner flow of the ``prefect`` platform: one flow run per trial (or reuse environment)
on a work pool. The platform deploys it once per experiment (or uses a deployment the user names) and
creates its runs; the worker runs them wherever the pool runs flows.

Parameters carry no secret: ``command`` (the run script on the shared storage, as the worker sees
it), ``metrics_url`` and ``token_block`` -- the *name* of the Prefect Secret block holding the trial's
metrics token, read here and handed to the trial in ``TRIALFLOW_METRICS_TOKEN``. The flow fails when
the command exits non-zero (the trial's own exit code and stderr are on the shared storage), and a
cancellation by Prefect ends the command's whole process tree (SIGTERM to its session; a trial's run
first marks the stop, ``stop_sent``, so a trial that answers it with a code of its own reads as
stopped); so does this flow's process dying without a word (a watchdog process stops the command's
session then).

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

from trialflow.trial.keeper import mark_stop_sent
from trialflow.trial.procs import watch_next_child
from trialflow.trial.protocol import META_DIR
from trialflow.trial.records import is_metric_line

HEARTBEAT_SECONDS = 2.0
MAX_LOG_LINE = 10_000  # characters of one output line sent to the run's logs


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
        assert proc.stdout is not None
        for line in proc.stdout:
            if not is_metric_line(line):  # results in NNI's stdout framing: trialflow reads them from the share
                logger.info(line.decode("utf-8", "replace").rstrip()[:MAX_LOG_LINE])
        code = proc.wait()
    except BaseException:  # cancelled or interrupted: the trial goes with the run
        if heartbeat:  # a trial's run (its meta directory is beside the script): its answer is the stop's
            mark_stop_sent(os.path.join(os.path.dirname(heartbeat), META_DIR))
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    if code != 0:
        raise RuntimeError(f"the trial's command exited with code {code}")
    return code
