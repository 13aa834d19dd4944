"""Copy an experiment into an Optuna study so optuna-dashboard (or Optuna's own analysis) can open it:

    trialflow experiment optuna <id> --storage sqlite:///study.db
    optuna-dashboard sqlite:///study.db

Parameters are flattened (nested choices become ``model/_name``, ``model/C``); numeric ones get a float
distribution spanning the values tried, others a categorical one. Finished trials keep their final
value and intermediate results; failed, cancelled and early-stopped trials are marked so.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from .store import ExperimentStore
from .tuners import scalar_or_none

_STATES = {"SUCCEEDED": TrialState.COMPLETE, "FAILED": TrialState.FAIL, "EARLY_STOPPED": TrialState.PRUNED,
           "USER_CANCELED": TrialState.FAIL, "SYS_CANCELED": TrialState.FAIL}


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[prefix + key] = value
    return out


def _distributions(flat_trials: list[dict[str, Any]]) -> dict[str, BaseDistribution]:
    values: dict[str, list[Any]] = {}
    for flat in flat_trials:
        for key, value in flat.items():
            values.setdefault(key, []).append(value)
    dists: dict[str, BaseDistribution] = {}
    for key, seen in values.items():
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in seen):
            dists[key] = FloatDistribution(float(min(seen)), float(max(seen)))
        else:
            dists[key] = CategoricalDistribution(sorted({str(v) for v in seen}))
    return dists


def export_to_optuna(store: ExperimentStore, storage: str, study_name: str | None = None,
                     maximize: bool = False) -> optuna.Study:
    trials = [t for t in store.trials() if t.is_terminal]
    flats = [_flatten(t.parameters) for t in trials]
    dists = _distributions(flats)
    study = optuna.create_study(storage=storage, study_name=study_name or f"trialflow-{store.experiment_id}",
                                direction="maximize" if maximize else "minimize", load_if_exists=True)
    intermediate: dict[str, dict[int, float]] = {}
    for m in store.metrics(type="PERIODICAL"):
        value = scalar_or_none(m.value)
        if value is not None:
            intermediate.setdefault(m.trial_id, {})[m.sequence] = value
    for trial, flat in zip(trials, flats, strict=True):
        state = _STATES[trial.status]
        value = None
        if state == TrialState.COMPLETE:
            value = scalar_or_none(trial.final)
            if value is None:
                state = TrialState.FAIL
        params = {k: (v if isinstance(dists[k], FloatDistribution) else str(v)) for k, v in flat.items()}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in flat}, value=value, state=state,
            intermediate_values=intermediate.get(trial.id, {}),
            user_attrs={"trialflow_trial_id": trial.id, "sequence": trial.sequence}))
    return study
