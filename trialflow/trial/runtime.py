"""What trial code calls: parameters in, metrics out. Standard library only (it runs on workers).

Inside an experiment (``NNI_PLATFORM`` set) the parameters come from ``$NNI_SYS_DIR/parameter.cfg``,
written for this trial alone before it started, and metrics go out on the channel the training
service chose (``TRIALFLOW_METRIC_CHANNEL``: ``file`` -> ``$NNI_SYS_DIR/.nni/metrics``,
``stdout`` -> marker lines, or ``http`` -> pushed to the metrics receiver *and* printed as marker
lines, the fallback the controller reads from the pod's log). Outside an experiment the trial runs
standalone: empty parameters, results printed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings

from .protocol import (
    ATTEMPT_ENV,
    CHECKPOINT_DIR,
    CHECKPOINT_ENV,
    METRICS_FILE,
    PARAMETER_FILE,
    REPORT_DESK_ENV,
    REPORTED_ENV,
)
from .records import MetricRecord, encode_file_record, encode_stdout_line

TYPE_CHECKING = False  # typing stays unimported at run time: its import would cost every trial process
if TYPE_CHECKING:
    from typing import Any

PARAMETER_WAIT_SECONDS = 600.0

_lock = threading.Lock()
# "intermediate" is None until the first report: a run after an interruption numbers on from the
# results stored before it (REPORTED_ENV), so none of them is taken for a duplicate
_state: dict[str, Any] = {"params": None, "parameter_id": None, "fetched": False, "intermediate": None, "final": 0}


def _platform() -> str | None:
    return os.environ.get("NNI_PLATFORM") or None


def get_experiment_id() -> str:
    return os.environ.get("NNI_EXP_ID", "STANDALONE")


def get_trial_id() -> str:
    return os.environ.get("NNI_TRIAL_JOB_ID", "STANDALONE")


def get_sequence_id() -> int:
    try:
        return int(os.environ.get("NNI_TRIAL_SEQ_ID", "0"))
    except ValueError:
        return 0


def _int_env(name: str) -> int:
    try:
        return max(0, int(os.environ.get(name, "0")))
    except ValueError:
        return 0


def get_attempt() -> int:
    """Which run of this trial this is: 0 for the first, n after n interruptions (preemption, eviction,
    a requeue) that the platform reported; each run gets the same parameters."""
    return _int_env(ATTEMPT_ENV)


def get_checkpoint_dir() -> str:
    """The trial's checkpoint folder, made if missing: the same folder for every run of the trial, on
    the storage its platform uses, so a run after an interruption resumes from what the one before
    saved. Outside an experiment: ``./checkpoint``."""
    path = os.environ.get(CHECKPOINT_ENV) or os.path.join(os.environ.get("NNI_SYS_DIR", "."), CHECKPOINT_DIR)
    os.makedirs(path, exist_ok=True)
    return path


def get_next_parameter() -> dict[str, Any] | None:
    """This trial's parameters (call once; a second call returns None, as in NNI)."""
    with _lock:
        if _state["fetched"]:
            return None
        _state["fetched"] = True
        if _platform() is None:
            warnings.warn("Running trial code without runtime: parameters are empty and results are "
                          "printed. Run it through `trialflow create` to tune it.", RuntimeWarning, stacklevel=2)
            _state["params"] = {}
            return {}
        record = _read_parameter_file()
        _state["params"] = params = _with_checkpoint_dirs(record["parameters"])
        _state["parameter_id"] = record.get("parameter_id")
        return params


CHECKPOINT_KEYS = ("load_checkpoint_dir", "save_checkpoint_dir")  # PBT's, as NNI names them


def _with_checkpoint_dirs(params: Any) -> Any:
    """PBT's checkpoint folders: relative ones are placed in the experiment's folder on this machine
    (the parent of ``trials/`` above ``$NNI_SYS_DIR``); the save folder is created."""
    if not isinstance(params, dict) or not all(isinstance(params.get(k), str) for k in CHECKPOINT_KEYS):
        return params
    out = dict(params)
    for key in CHECKPOINT_KEYS:
        if not os.path.isabs(out[key]):
            out[key] = os.path.join(_experiment_dir(), out[key])
    os.makedirs(out["save_checkpoint_dir"], exist_ok=True)
    return out


def _experiment_dir() -> str:
    """``<experiment>`` of ``<experiment>/trials/<trial>[/replicas/<pod>]`` (every platform's layout)."""
    here = os.path.abspath(os.environ.get("NNI_SYS_DIR", "."))
    path = here
    while os.path.dirname(path) != path:
        parent = os.path.dirname(path)
        if os.path.basename(parent) == "trials":
            return os.path.dirname(parent)
        path = parent
    return os.path.dirname(here)


def get_current_parameter(tag: str | None = None) -> Any:
    params = _state["params"]
    return params if tag is None or params is None else params.get(tag)


def _read_parameter_file() -> dict[str, Any]:
    path = os.path.join(os.environ.get("NNI_SYS_DIR", "."), PARAMETER_FILE)
    deadline = time.monotonic() + PARAMETER_WAIT_SECONDS
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if text.strip():
                record = json.loads(text)
                if not isinstance(record, dict) or "parameters" not in record:
                    raise RuntimeError(f"{path} does not hold a parameter record")
                return record
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no parameters arrived in {path} within {PARAMETER_WAIT_SECONDS:.0f} s")
        time.sleep(0.05)


def _send(kind: str, metric: Any) -> None:
    sequence = _record(kind, metric)
    if sequence is not None and kind == "PERIODICAL" and os.environ.get(REPORT_DESK_ENV):
        from .verdicts import after_result

        after_result(get_trial_id(), sequence, _metrics_token)


def _record(kind: str, metric: Any) -> int | None:
    """Put the result on the trial's channel; returns its sequence number (None outside an experiment)."""
    with _lock:
        if _platform() is not None and not _state["fetched"]:
            raise AssertionError("get_next_parameter() needs to be called before reporting results")
        counter = "intermediate" if kind == "PERIODICAL" else "final"
        if _state[counter] is None:
            _state[counter] = _int_env(REPORTED_ENV)
        sequence = _state[counter]
        _state[counter] += 1
        if _platform() is None:
            label = f"Intermediate result: {metric}  (Index {sequence})" if kind == "PERIODICAL" \
                else f"Final result: {metric}"
            print(label, flush=True)
            return None
        record = MetricRecord(get_trial_id(), kind, sequence, metric, _state["parameter_id"])
        channel = os.environ.get("TRIALFLOW_METRIC_CHANNEL") or ("file" if os.environ.get("NNI_SYS_DIR") else "stdout")
        if channel == "file":
            if _state.get("metrics_file") is None:
                path = os.path.join(os.environ["NNI_SYS_DIR"], METRICS_FILE)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                _state["metrics_file"] = open(path, "ab")  # noqa: SIM115 -- kept open for the trial's life
            _state["metrics_file"].write(encode_file_record(record))
            _state["metrics_file"].flush()
        else:
            if channel == "http":
                _pusher().push(record.to_json())
            sys.stdout.write(encode_stdout_line(record) + "\n")
            sys.stdout.flush()
        return sequence


def _pusher() -> Any:
    if _state.get("pusher") is None:
        from .push import MetricPusher

        _state["pusher"] = MetricPusher(os.environ["TRIALFLOW_METRICS_URL"], _metrics_token(), get_trial_id())
    return _state["pusher"]


def _metrics_token() -> str:
    """The trial's token: ``TRIALFLOW_METRICS_TOKEN`` (a Kubernetes Secret's env), or the file that
    ``TRIALFLOW_METRICS_TOKEN_FILE`` names (on the share, for platforms without a secret store)."""
    token = os.environ.get("TRIALFLOW_METRICS_TOKEN")
    path = os.environ.get("TRIALFLOW_METRICS_TOKEN_FILE")
    if token or not path:
        return token or ""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        sys.stderr.write(f"trialflow: metrics token file {path} not readable ({exc}); metrics go to stdout only\n")
        return ""


def report_intermediate_result(metric: Any) -> None:
    """An intermediate result (a number, or a dict with a numeric ``default``)."""
    _send("PERIODICAL", metric)


def report_final_result(metric: Any) -> None:
    """The trial's final result (a number, or a dict with a numeric ``default``)."""
    _send("FINAL", metric)
