"""An Optuna study kept in step with an experiment's store, for optuna-dashboard and Optuna's plots.

:class:`OptunaMirror` reads the store and writes the difference into any Optuna storage: each call
to :meth:`OptunaMirror.sync` adds the trials that started since, the intermediate results reported
since, and the end of the trials that finished since. It only reads the store, so the experiment
pays nothing for it; it runs in whichever process shows the study (``trialflow dashboard``, the
HTML report, ``trialflow experiment optuna``).

Mapping:
- parameters are flattened as the search space names them: a nested choice ``model`` becomes
  ``model`` (the chosen ``_name``) plus ``model/<name>/<sub-parameter>``; distributions come from the
  search space, so every trial of a parameter shares one (Optuna's importance and parallel-coordinate
  plots need that). A choice value that is not a plain scalar is shown as its JSON text. A value the
  space cannot express is kept as the user attribute ``param:<name>`` instead;
- WAITING trials are left out until they run; SUCCEEDED with a numeric final result is COMPLETE
  (without one, FAIL); with several objectives the study has one direction and metric name per objective,
  a usable final result gives a COMPLETE trial its values and its constraint violations (Optuna's
  ``constraints`` system attribute, which optuna-dashboard's Pareto-front plot reads for feasibility);
  EARLY_STOPPED is PRUNED; FAILED and both CANCELEDs are FAIL. The trialflow status and trial id are
  user attributes, so a study can be matched back to the experiment;
- finite intermediate results are the trial's intermediate values, by their reporting sequence.

Resumable: a mirror opened on a storage that already holds the study carries on from what it finds
there (matched by the ``trialflow_trial_id`` user attribute), so re-running never duplicates a trial.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from ..foundation.optuna_logging import quietly
from ..foundation.status import TrialStatus
from ..records.changed_trials import OTHER_CLOCK_SLACK, ChangedTrials
from ..records.search_space import Option, Param, SearchSpace
from ..records.store import ExperimentStore, TrialRecord
from ..tuners import scalar_or_none
from ..tuners.objectives import Objectives

TRIAL_ID_ATTR = "trialflow_trial_id"
_FAILED = TrialState.FAIL
_STATES: dict[str, TrialState] = {
    TrialStatus.RUNNING: TrialState.RUNNING, TrialStatus.SUCCEEDED: TrialState.COMPLETE,
    TrialStatus.EARLY_STOPPED: TrialState.PRUNED, TrialStatus.FAILED: _FAILED, TrialStatus.USER_CANCELED: _FAILED,
    TrialStatus.SYS_CANCELED: _FAILED}
_MAX_IDS_PER_QUERY = 500
_NORMAL_SPREAD = 6.0  # a normal parameter's axis: mu +- 6 sigma
_CONSTRAINTS_ATTR = "constraints"  # Optuna's system attribute for a trial's constraint violations


def _choice(value: Any) -> Any:
    """A choice value as Optuna can hold it: scalars as they are, anything else as JSON text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True)


def _distribution(param: Param) -> BaseDistribution:
    v = param.values
    if param.type == "choice":
        return CategoricalDistribution([_choice(o.name if isinstance(o, Option) else o) for o in v])
    if param.type == "randint":
        return IntDistribution(int(v[0]), max(int(v[0]), int(v[1]) - 1))
    if param.type in ("uniform", "quniform"):
        return FloatDistribution(float(v[0]), float(v[1]))
    if param.type in ("loguniform", "qloguniform"):
        return FloatDistribution(float(v[0]), float(v[1]), log=True)
    low, high = v[0] - _NORMAL_SPREAD * v[1], v[0] + _NORMAL_SPREAD * v[1]
    if param.type in ("lognormal", "qlognormal"):
        return FloatDistribution(math.exp(max(low, -700.0)), math.exp(min(high, 700.0)), log=True)
    return FloatDistribution(float(low), float(high))


def flatten(space: SearchSpace | None, params: dict[str, Any],
            prefix: str = "") -> tuple[dict[str, Any], dict[str, BaseDistribution], dict[str, Any]]:
    """A trial's parameters as Optuna parameters: (values, distributions, the ones that do not fit)."""
    values: dict[str, Any] = {}
    dists: dict[str, BaseDistribution] = {}
    misfits: dict[str, Any] = {}
    known = {p.name: p for p in space.params} if space is not None else {}
    for name, value in params.items():
        key, param = prefix + name, known.get(name)
        if param is None:
            misfits[key] = value
            continue
        dist = _distribution(param)
        options = {o.name: o for o in param.values if isinstance(o, Option)}
        chosen = value.get("_name") if options and isinstance(value, dict) else value
        if param.type == "choice":
            chosen = _choice(chosen)
            if chosen not in dist.choices:  # type: ignore[attr-defined]
                misfits[key] = value
                continue
        elif (isinstance(chosen, bool) or not isinstance(chosen, int | float)
              or not dist.low <= chosen <= dist.high  # type: ignore[attr-defined]
              or (isinstance(dist, IntDistribution) and chosen != int(chosen))):
            misfits[key] = value  # e.g. a search space changed under an imported trial
            continue
        values[key], dists[key] = chosen, dist
        option = options.get(value.get("_name")) if options and isinstance(value, dict) else None
        if option is not None:
            sub = {k: v for k, v in value.items() if k != "_name"}
            more = flatten(option.space, sub, f"{key}/{option.name}/")
            values.update(more[0])
            dists.update(more[1])
            misfits.update(more[2])
    return values, dists, misfits


@dataclass
class _Mirrored:
    trial_id: int  # Optuna's
    finished: bool
    steps: set[int] = field(default_factory=set)


def _outcome_attrs(trial: TrialRecord) -> dict[str, Any]:
    """The trialflow status, and a final result Optuna cannot hold as a value (a dict of metrics)."""
    attrs: dict[str, Any] = {"status": trial.status}
    if isinstance(trial.final, dict):
        attrs["final"] = trial.final
    return attrs


def _when(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts) if ts else None


class OptunaMirror:
    """One experiment's trials as one Optuna study in ``storage`` (a URL or a storage object)."""

    def __init__(self, store: ExperimentStore, storage: str | BaseStorage, study_name: str, maximize: bool,
                 space: SearchSpace | None, objectives: Objectives | None = None) -> None:
        self.store = store
        self.space = space
        self.objectives = objectives
        self.storage = optuna.storages.get_storage(storage)
        directions = [StudyDirection.MAXIMIZE if up else StudyDirection.MINIMIZE for up in
                      ([maximize] if objectives is None else [o.maximize for o in objectives.objectives])]
        with quietly():
            study = optuna.create_study(storage=self.storage, study_name=study_name, load_if_exists=True,
                                        directions=directions)
            if objectives is not None:
                with warnings.catch_warnings():  # experimental in Optuna, and what optuna-dashboard labels axes by
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study.set_metric_names(objectives.names)
        self.study_name = study_name
        self.study_id: int = study._study_id
        self._mirrored: dict[str, _Mirrored] = {}
        self._changed = ChangedTrials(store, OTHER_CLOCK_SLACK)
        for trial in self.storage.get_all_trials(self.study_id, deepcopy=False):
            name = trial.user_attrs.get(TRIAL_ID_ATTR)
            if name is not None:
                self._mirrored[name] = _Mirrored(trial._trial_id, trial.state.is_finished(),
                                                 set(trial.intermediate_values))

    @property
    def trial_count(self) -> int:
        return len(self._mirrored)

    def sync(self) -> int:
        """Write what changed in the store since the last call; returns how many trials it touched."""
        todo = [t for t in self._changed.read() if t.status != TrialStatus.WAITING and not self._finished(t.id)]
        steps = self._intermediates([t.id for t in todo])
        for trial in todo:
            self._sync_trial(trial, steps.get(trial.id, {}))
        return len(todo)

    def _finished(self, trial_id: str) -> bool:
        mirrored = self._mirrored.get(trial_id)
        return mirrored is not None and mirrored.finished

    def _intermediates(self, trial_ids: list[str]) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        if not trial_ids:
            return out
        wanted = set(trial_ids)
        # a first sync of a large experiment reads them all rather than bind thousands of ids
        selected = None if len(wanted) > _MAX_IDS_PER_QUERY else trial_ids
        for metric in self.store.metrics(trial_ids=selected, type="PERIODICAL"):
            value = scalar_or_none(metric.value)
            if metric.trial_id in wanted and value is not None and math.isfinite(value):
                out.setdefault(metric.trial_id, {})[metric.sequence] = value
        return out

    def _outcome(self, trial: TrialRecord) -> tuple[TrialState, list[float] | None, dict[str, Any]]:
        """The trial's Optuna state, its values (COMPLETE only) and its system attributes."""
        state = _STATES.get(trial.status, TrialState.RUNNING)
        if state != TrialState.COMPLETE:
            return state, None, {}
        if self.objectives is not None:
            result = self.objectives.read_or_none(trial.final)
            if result is None:
                return _FAILED, None, {}
            return state, list(result.values), {_CONSTRAINTS_ATTR: list(result.violations)} if result.violations else {}
        value = scalar_or_none(trial.final)
        if value is None or not math.isfinite(value):
            return _FAILED, None, {}
        return state, [value], {}

    def _sync_trial(self, trial: TrialRecord, steps: dict[int, float]) -> None:
        state, values, system = self._outcome(trial)
        mirrored = self._mirrored.get(trial.id)
        if mirrored is None:
            self._mirrored[trial.id] = self._create(trial, state, values, system, steps)
            return
        for step in sorted(set(steps) - mirrored.steps):
            self.storage.set_trial_intermediate_value(mirrored.trial_id, step, steps[step])
            mirrored.steps.add(step)
        if state.is_finished():
            for key, attr in _outcome_attrs(trial).items():
                self.storage.set_trial_user_attr(mirrored.trial_id, key, attr)
            for key, attr in system.items():
                self.storage.set_trial_system_attr(mirrored.trial_id, key, attr)
            self.storage.set_trial_state_values(mirrored.trial_id, state, values)
            mirrored.finished = True

    def _create(self, trial: TrialRecord, state: TrialState, values: list[float] | None, system: dict[str, Any],
                steps: dict[int, float]) -> _Mirrored:
        """One storage write for the whole trial as it stands (a finished one never needs another)."""
        params, dists, misfits = flatten(self.space, trial.parameters)
        attrs: dict[str, Any] = {TRIAL_ID_ATTR: trial.id, "sequence": trial.sequence, **_outcome_attrs(trial),
                                 **{f"param:{k}": v for k, v in misfits.items()}}
        finished = state.is_finished()
        template = FrozenTrial(number=-1, state=state, value=None, values=values,
                               datetime_start=_when(trial.start_time or trial.submit_time),
                               datetime_complete=_when(trial.end_time) if finished else None,
                               params=params, distributions=dists, user_attrs=attrs, system_attrs=system,
                               intermediate_values=steps, trial_id=-1)
        return _Mirrored(self.storage.create_new_trial(self.study_id, template_trial=template), finished,
                         set(steps))
