"""Several objectives and constraints: the config's rules, the Pareto set on hand-computed fronts, the
tuners that take them, and experiments that run them end to end on local trials."""

from __future__ import annotations

import pytest

from tests.conftest import base_config, write_trial
from trialflow import parse_config, run_experiment
from trialflow.config import ConfigError
from trialflow.experiments import open_store
from trialflow.objectives import Bound, MultiResult, Objective, Objectives
from trialflow.results import pareto_set
from trialflow.tuners import InvalidMetric, TunerError, create_tuner
from trialflow.tuners.base import Tuner

TWO = [{"name": "accuracy", "direction": "maximize"}, {"name": "latency_ms", "direction": "minimize"}]
SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}, "y": {"_type": "uniform", "_value": [0, 1]}}
ACC_LATENCY = Objectives((Objective("accuracy", True), Objective("latency_ms", False)), (Bound("memory_gb", max=8),))


def _config(tmp_path, **overrides):
    (tmp_path / "code").mkdir(exist_ok=True)
    return base_config(tmp_path / "code", tmp_path / "w", searchSpace=SPACE, objectives=TWO, **overrides)


@pytest.mark.parametrize("change,says", [
    ({"objectives": [{"name": "accuracy", "direction": "up"}]}, "objectives[0].direction: Input should be "
                                                                "'maximize' or 'minimize'"),
    ({"objectives": [*TWO, {"name": "accuracy", "direction": "minimize"}]}, "objective 'accuracy' is listed twice"),
    ({"constraints": [{"name": "memory_gb"}]}, "constraint 'memory_gb' needs a min, a max or both"),
    ({"constraints": [{"name": "memory_gb", "min": 9, "max": 8}]}, "min 9.0 is above max 8.0"),
    ({"constraints": [{"name": "m", "max": 1}, {"name": "m", "min": 0}]}, "constraint 'm' is listed twice"),
    ({"objectives": None, "constraints": [{"name": "memory_gb", "max": 8}]}, "constraints need objectives"),
    ({"tuner": {"name": "Anneal"}}, "tuner Anneal cannot tune several objectives or constraints; use one of TPE, "
                                    "Random, NSGA2, NSGA3"),
])
def test_a_wrong_objectives_section_is_one_line_naming_the_fix(tmp_path, change, says):
    with pytest.raises(ConfigError) as caught:
        parse_config({**_config(tmp_path), **change})
    assert says in str(caught.value)
    assert str(caught.value).count("\n  - ") == 1  # one mistake, one line


def test_a_config_without_objectives_is_single_objective(tmp_path):
    (tmp_path / "code").mkdir()
    config = parse_config(base_config(tmp_path / "code", tmp_path / "w"))
    assert config.multi_objective is None and "objectives" not in config.dump()
    assert parse_config(_config(tmp_path)).multi_objective.names == ["accuracy", "latency_ms"]


def test_results_are_read_by_their_keys_and_a_missing_one_is_named():
    result = ACC_LATENCY.read({"default": 0.9, "accuracy": 0.9, "latency_ms": 12, "memory_gb": 9.5})
    assert result == MultiResult((0.9, 12.0), (1.5,)) and not result.feasible
    assert ACC_LATENCY.read({"accuracy": 1, "latency_ms": 3, "memory_gb": 8}).feasible  # the bound itself holds
    with pytest.raises(InvalidMetric, match="no objective 'latency_ms'"):
        ACC_LATENCY.read({"accuracy": 0.9, "memory_gb": 1})
    with pytest.raises(InvalidMetric, match="constraint 'memory_gb' of the final result must be a finite number"):
        ACC_LATENCY.read({"accuracy": 0.9, "latency_ms": 1, "memory_gb": float("nan")})
    with pytest.raises(InvalidMetric, match="needs a dict final result with the keys accuracy, latency_ms"):
        ACC_LATENCY.read(0.9)
    lower = Objectives((Objective("a", True),), (Bound("m", min=2),))
    assert lower.read({"a": 1, "m": 1}).violations == (1.0,) and lower.read({"a": 1, "m": 3}).feasible


def test_the_pareto_set_of_a_hand_computed_front():
    # (accuracy max, latency min): b dominates a; c and d trade off with b; e ties b exactly (kept:
    # neither dominates); f is the best of all but breaks the memory bound
    points = {"a": (0.80, 20.0, 1), "b": (0.85, 15.0, 1), "c": (0.95, 30.0, 1), "d": (0.70, 5.0, 1),
              "e": (0.85, 15.0, 2), "f": (0.99, 1.0, 9), "g": (0.70, 30.0, 1)}
    results = {k: ACC_LATENCY.read({"accuracy": a, "latency_ms": lat, "memory_gb": m})
               for k, (a, lat, m) in points.items()}
    assert ACC_LATENCY.pareto_optimal(results) == ["b", "c", "d", "e"]
    assert ACC_LATENCY.dominates((0.85, 15.0), (0.80, 20.0)) and not ACC_LATENCY.dominates((0.85, 15), (0.85, 15))
    assert not ACC_LATENCY.dominates((0.95, 30.0), (0.85, 15.0))


@pytest.mark.parametrize("name", ["TPE", "Random", "NSGA2", "NSGA3"])
def test_each_multi_objective_tuner_learns_from_results_and_constraints(name):
    from types import SimpleNamespace

    spec = SimpleNamespace(name=name, class_name=None, class_args={"seed": 3}, code_directory=None)
    tuner: Tuner = create_tuner(spec, SPACE, ACC_LATENCY)
    told = []
    for _ in range(12):
        suggestion = tuner.suggest()
        x, y = suggestion.parameters["x"], suggestion.parameters["y"]
        result = ACC_LATENCY.read({"accuracy": x, "latency_ms": 10 * x + y, "memory_gb": 16 * y})
        tuner.conclude(suggestion.parameter_id, result, None, True)
        told.append(result)
    study = tuner.study  # type: ignore[attr-defined]
    assert [list(t.values) for t in study.trials] == [list(r.values) for r in told]
    constraints = [{"constraints:memory_gb": r.violations[0]} for r in told]
    assert [{k: v for k, v in t.system_attrs.items() if k.startswith("constraints")} for t in study.trials] == \
        constraints
    # a resumed tuner is told the same trials with their constraints, and goes on
    again: Tuner = create_tuner(spec, SPACE, ACC_LATENCY)
    for trial, result in zip(study.trials, told, strict=True):
        again.replay(trial.number, trial.params, result)
    replayed = again.study.trials  # type: ignore[attr-defined]
    assert [{k: v for k, v in t.system_attrs.items() if k.startswith("constraints")} for t in replayed] == \
        constraints
    assert again.suggest() is not None


def test_a_single_objective_tuner_is_refused_several_objectives():
    from types import SimpleNamespace

    spec = SimpleNamespace(name="Anneal", class_name=None, class_args={}, code_directory=None)
    with pytest.raises(TunerError, match="cannot tune several objectives; use one of TPE, Random, NSGA2, NSGA3"):
        create_tuner(spec, SPACE, ACC_LATENCY)


TRIAL = """\
import nni
p = nni.get_next_parameter()
x, y = p["x"], p["y"]
result = {"default": x, "accuracy": x, "latency_ms": 10 * x * x + y, "memory_gb": 16 * y}
if x > 0.9:
    del result["latency_ms"]  # a result without an objective: the tuner is told it failed
nni.report_final_result(result)
"""


@pytest.mark.parametrize("tuner", [{"name": "TPE", "classArgs": {"seed": 2}},
                                   {"name": "NSGA2", "classArgs": {"seed": 2, "population_size": 4}},
                                   {"name": "NSGA3", "classArgs": {"seed": 2, "population_size": 4}},
                                   {"name": "Random", "classArgs": {"seed": 2}}],
                         ids=lambda t: t["name"])
def test_a_multi_objective_experiment_ends_with_its_pareto_set(tmp_path, prefect_server, tuner, capsys):
    write_trial(tmp_path / "code", TRIAL)
    config = _config(tmp_path, tuner=tuner, maxTrialNumber=10, trialConcurrency=3,
                     constraints=[{"name": "memory_gb", "max": 8}])
    result = run_experiment(config)
    assert result.status == "DONE" and len(result.trials) == 10
    assert result.best is None and result.best_value is None  # several objectives: no best trial
    # the Pareto set, checked against every pair of feasible results
    usable = {t.id: (t.final["accuracy"], t.final["latency_ms"]) for t in result.trials
              if "latency_ms" in t.final and t.final["memory_gb"] <= 8}
    front = {i for i, (a, lat) in usable.items()
             if not any(b >= a and m <= lat and (b, m) != (a, lat) for b, m in usable.values())}
    assert front and {t.id for t in result.pareto} == front
    store = open_store(tmp_path / "w", result.experiment_id)
    record = store.experiment()
    assert record.best_trial is None  # the audit checks this as well
    assert pareto_set(store.trials(), ACC_LATENCY) == result.pareto
    # every trial keeps its outcome, one without an objective too
    assert all(t.status == "SUCCEEDED" for t in result.trials)
