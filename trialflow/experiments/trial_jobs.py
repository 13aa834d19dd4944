"""An experiment, its trials and their reported results in the shape of NNI's REST API (its manager's
``/experiment``, ``/trial-jobs`` and ``/metric-data``), which ``nnictl experiment show`` and ``nnictl trial
ls`` print and NNI's Python API decodes: times in milliseconds, each parameter set as its JSON text, and
each result's ``data`` as the JSON text of the text the trial sent (NNI's manager stores
``JSON.stringify`` of the trial's ``nni.dump(metric)``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..trial.protocol import STDERR_FILE

if TYPE_CHECKING:
    from ..records.store_records import ExperimentRecord

# what nnictl experiment list prints around its lines (%s: the lines), and the form of its times
NNICTL_LIST_FRAME = "-" * 88 + "\n                Experiment information\n%s\n" + "-" * 88 + "\n"
NNICTL_LIST_TIME = "%Y-%m-%d %H:%M:%S"


def ms(seconds: float | None) -> int | None:
    """A time in seconds as NNI's milliseconds (None stays None)."""
    return None if seconds is None else int(seconds * 1000)


def nnictl_time(seconds: float) -> str:
    """A time (seconds since the epoch) as nnictl prints one: local time, ``%Y/%m/%d %H:%M:%S``."""
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(seconds))


def nnictl_list_line(record: ExperimentRecord, port: int | None, platform: str | None, trials: int,
                     folder: Path) -> str:
    """An experiment's line as nnictl experiment list prints it (id, name, status, port, platform, start
    and end as local times, ``N/A`` for what it lacks), then its trial count and folder, each value
    whole. A character that is not printable (a name's line break or terminal escape, say) is shown
    escaped, so each experiment stays one line."""
    def when(seconds: float | None) -> str:
        return "N/A" if seconds is None else time.strftime(NNICTL_LIST_TIME, time.localtime(seconds))

    shown = (("Id", record.id), ("Name", record.name or "N/A"), ("Status", record.status),
             ("Port", "N/A" if port is None else port), ("Platform", platform or "N/A"),
             ("StartTime", when(record.start_time)), ("EndTime", when(record.end_time)), ("Trials", trials),
             ("Directory", folder))
    return "    ".join(f"{key}: {_printable(str(value))}" for key, value in shown) + "\n"


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def nnictl_dates(content: dict[str, Any]) -> dict[str, Any]:
    """``content`` with its ``startTime`` and ``endTime`` (milliseconds) as nnictl prints them
    (:func:`nnictl_time`)."""
    return {**content, **{key: nnictl_time(content[key] // 1000) for key in ("startTime", "endTime")
                          if content.get(key)}}


def experiment_profile(record: Any, log_dir: str) -> dict[str, Any]:
    """The experiment (its store record) as NNI's experiment profile: the config in force as ``params``
    (NNI's v2 fields, updates included), start and end in milliseconds (no end while it has none), the
    seconds it has run (``execDuration``: of an ended experiment, the run time its runs spent, which
    ``maxExperimentDuration`` counts; of a live one, the time since its start), its folder ``log_dir`` and
    the next trial's sequence number."""
    from ..foundation.status import EXPERIMENT_LIVE
    from ..records.store_records import Control, config_in_force

    began, spent = record.start_time, record.controls.get(Control.ELAPSED_SECONDS)
    if record.status not in EXPERIMENT_LIVE and spent is not None:
        duration = int(spent)
    else:
        duration = 0 if began is None else int((record.end_time or time.time()) - began)
    profile = {"id": record.id, "params": config_in_force(record)[0], "startTime": ms(began), "logDir": log_dir,
               "nextSequenceId": record.next_sequence, "execDuration": duration}
    if record.end_time is not None:
        profile["endTime"] = ms(record.end_time)
    return profile


def metric_records(trials: list[Any], metrics: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Each of ``trials``' reported results (of ``metrics``, store records), in report order, keyed by
    trial id."""
    parameter_ids = {t.id: t.parameter_id for t in trials}
    out: dict[str, list[dict[str, Any]]] = {}
    for m in sorted(metrics, key=lambda m: (m.time, m.type == "FINAL", m.sequence)):
        if m.trial_id not in parameter_ids:
            continue
        out.setdefault(m.trial_id, []).append({
            "timestamp": ms(m.time) or 0, "trialJobId": m.trial_id, "parameterId": parameter_ids[m.trial_id],
            "type": m.type, "sequence": m.sequence, "data": json.dumps(json.dumps(m.value))})
    return out


def trial_jobs(trials: list[Any], finals: list[Any]) -> list[dict[str, Any]]:
    """The trials (store records, in submission order) as NNI's trial jobs, with their final results
    (``finals``); a field NNI leaves out while it has no value (times, paths, message, final result) is
    left out too."""
    final = metric_records(trials, finals)
    jobs = []
    for t in trials:
        parameters = {"parameter_id": t.parameter_id, "parameter_source": "algorithm", "parameters": t.parameters,
                      "parameter_index": 0}
        job: dict[str, Any] = {"trialJobId": t.id, "sequenceId": t.sequence, "status": t.status,
                               "hyperParameters": [json.dumps(parameters)]}
        optional = {"message": t.message, "startTime": ms(t.start_time), "endTime": ms(t.end_time),
                    "logPath": t.log_dir, "stderrPath": f"{t.log_dir}/{STDERR_FILE}" if t.log_dir else None,
                    "finalMetricData": final.get(t.id)}
        job.update((k, v) for k, v in optional.items() if v is not None)
        jobs.append(job)
    return jobs
