"""The keeper/worker file protocol: names of the files a trial's keeper, a reuse worker and the
controller exchange (standard library only; the controller side is ``trialflow.platforms.trialdir``).

A trial directory holds ``parameter.cfg``, ``trial.stdout``, ``trial.stderr``, ``trial.log`` and the
meta directory ``.nni/`` with ``keeper.json`` (what to run), ``keeper.lock`` (claimed by the one keeper
allowed to start), ``keeper.pid``, ``started``, ``stop_sent`` (trialflow's kill found the trial
running), ``state`` (how it ended) and ``metrics``, and ``checkpoint/``, the trial's own folder that
outlives its runs (an interrupted run's ``.nni/`` is set aside as ``.nni-<attempt>``). A reuse
environment directory holds ``worker.json``, the ``queue/``, ``hold/``, ``taken/`` and ``kill/`` boxes
and the ``heartbeat`` and ``stop`` files.
"""

from __future__ import annotations

import os

# ---- trial directory ----
# NNI's limits of a trial code directory: the bundle refuses more at upload, the worker at unpack.
MAX_CODE_FILES = 2000
MAX_CODE_BYTES = 300 * 1024 * 1024
PARAMETER_FILE = "parameter.cfg"
STDOUT_FILE = "trial.stdout"
STDERR_FILE = "trial.stderr"
TRIAL_LOG_FILE = "trial.log"
LOG_FILES = (STDOUT_FILE, STDERR_FILE, TRIAL_LOG_FILE)
STDERR_TAIL = "; stderr tail:"  # in a failed trial's message, before the last lines of its stderr
OUTPUT_FILES = (STDOUT_FILE, STDERR_FILE)  # what the trial's command printed
META_DIR = ".nni"
KEEPER_SPEC = "keeper.json"
KEEPER_LOCK = "keeper.lock"
KEEPER_PID = "keeper.pid"
STARTED = "started"
STOP_SENT = "stop_sent"
STATE = "state"
METRICS = "metrics"
METRICS_FILE = os.path.join(META_DIR, METRICS)
# kept across a trial's runs (a run an interruption ended is followed by another): the folder a trial
# checkpoints to and resumes from, and what tells a run which one it is and where its results go on
CHECKPOINT_DIR = "checkpoint"  # in the trial directory
CHECKPOINT_ENV = "TRIALFLOW_CHECKPOINT_DIR"
ATTEMPT_ENV = "TRIALFLOW_ATTEMPT"  # 0 for the first run, n after n interruptions
REPORTED_ENV = "TRIALFLOW_INTERMEDIATE_REPORTED"  # intermediate results stored before this run
# the controller's report desk (``trialflow.platforms.report_desk``): where a trial asks, after an
# intermediate result, whether its assessor stops it (set only for trials whose controller can answer)
REPORT_DESK_ENV = "TRIALFLOW_REPORT_DESK"  # the desk's Unix socket, or RECEIVER_DESK
RECEIVER_DESK = "receiver"  # ask through the metrics receiver (the HTTP channel's URL and token)

# ---- reuse environment directory ----
WORKER_INFO = "worker.json"
QUEUE = "queue"
HOLD = "hold"
TAKEN = "taken"
KEEPER_NOTE = ".keeper"  # taken/<trial id>.keeper: the keeper the worker started for it
KILL = "kill"
HEARTBEAT = "heartbeat"
STOP = "stop"

# ---- timings ----
HEARTBEAT_SECONDS = 10.0  # the controller touches ``heartbeat`` at most this often
WORKER_IDLE_TIMEOUT = 900.0  # a worker whose heartbeat is older than this leaves


def with_stderr_tail(message: str, tail: str | None) -> str:
    """A failed trial's message: ``message``, then (when its stderr ends with something) :data:`STDERR_TAIL`
    and, on the lines after it, ``tail``."""
    return message + (f"{STDERR_TAIL}\n{tail}" if tail else "")
