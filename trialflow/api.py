"""Python API for notebooks and scripts: ``trialflow.run_experiment(config)``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ExperimentConfig, load_config, parse_config
from .experiments import create_experiment, open_store
from .store import TrialRecord
from .ui import best_trial, is_maximize, trial_value


@dataclass
class ExperimentResult:
    """The outcome of an experiment: status, best trial and every trial record."""

    experiment_id: str
    status: str
    directory: Path
    trials: list[TrialRecord]
    best: TrialRecord | None

    @property
    def best_value(self) -> float | None:
        return trial_value(self.best) if self.best else None

    def records(self) -> list[dict[str, Any]]:
        return [{"trial_id": t.id, "sequence": t.sequence, "status": t.status, "value": trial_value(t),
                 "final": t.final, **{f"params.{k}": v for k, v in t.parameters.items()}} for t in self.trials]

    def to_dataframe(self) -> Any:
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame(self.records())


ConfigLike = str | os.PathLike[str] | dict[str, Any] | ExperimentConfig


def _as_config(config: ConfigLike) -> tuple[ExperimentConfig, str | None]:
    if isinstance(config, ExperimentConfig):
        return config, None
    if isinstance(config, dict):
        return parse_config(config), None
    path = os.fspath(config)
    return load_config(path), os.path.abspath(path)


def run_experiment(config: ConfigLike) -> ExperimentResult:
    """Run an experiment to its end in this process and return its result."""
    cfg, path = _as_config(config)
    experiment_id, exp_dir = create_experiment(cfg, path)
    from .flows.experiment import experiment_flow

    status = experiment_flow(path, experiment_id, str(exp_dir.parent))
    return result_of(exp_dir.parent, experiment_id, cfg, status)


def result_of(root: Path, experiment_id: str, cfg: ExperimentConfig, status: str | None = None) -> ExperimentResult:
    store = open_store(root, experiment_id)
    try:
        trials = store.trials()
        status = status or store.experiment().status
    finally:
        store.close()
    return ExperimentResult(experiment_id, status, root / experiment_id, trials, best_trial(trials, is_maximize(cfg)))
