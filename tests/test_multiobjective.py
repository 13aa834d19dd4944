"""Several objectives and constraints: the config's rules, the Pareto set on hand-computed fronts, the
tuners that take them, and experiments that run them end to end on local trials."""

from __future__ import annotations

import pytest

from tests.conftest import base_config, wait_for, write_trial
from trialflow import parse_config, run_experiment
from trialflow.config import ConfigError
from trialflow.experiments import open_store
from trialflow.experiments.results import pareto_set
from trialflow.tuners import InvalidMetric, TunerError, create_tuner
from trialflow.tuners.base import Tuner
from trialflow.tuners.objectives import Bound, MultiResult, Objective, Objectives

TWO = [{"name": "accuracy", "direction": "maximize"}, {"name": "latency_ms", "direction": "minimize"}]
TWO_NAMES = ["accuracy", "latency_ms"]
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
                                    "Random, GridSearch, GPTuner, SMAC, NSGA2, NSGA3"),
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


def _spec(name, **args):
    from types import SimpleNamespace

    return SimpleNamespace(name=name, class_name=None, class_args=args, code_directory=None)


def _told(tuner: Tuner, count: int) -> list[tuple[dict, MultiResult]]:
    """Ask ``count`` suggestions and tell each its result on the accuracy/latency/memory problem; each
    suggestion's parameters (its raw values under ``"raw"``) with its result."""
    told = []
    for _ in range(count):
        suggestion = tuner.suggest()
        x, y = suggestion.parameters["x"], suggestion.parameters["y"]
        result = ACC_LATENCY.read({"accuracy": x, "latency_ms": 10 * x + y, "memory_gb": 16 * y})
        tuner.conclude(suggestion.parameter_id, result, None, True)
        told.append(({**suggestion.parameters, "raw": suggestion.raw}, result))
    return told


def test_parego_scalarization_of_hand_computed_results():
    results = [_result(0.9, 10), _result(0.5, 30), _result(0.7, 20), _result(0.99, 1, memory=9.0)]
    # normalised costs (accuracy negated, then to [0, 1]; latency to [0, 1]) of the three feasible ones plus
    # the infeasible one, which takes part in the normalisation: accuracy 0.99 is the best seen
    costs = ACC_LATENCY.scalarized(results, [0.5, 0.5])
    acc = [(0.99 - a) / 0.49 for a in (0.9, 0.5, 0.7)]
    lat = [(t - 1) / 29 for t in (10, 30, 20)]
    expected = [max(0.5 * a, 0.5 * t) + 0.05 * (0.5 * a + 0.5 * t) for a, t in zip(acc, lat, strict=True)]
    assert costs[:3] == pytest.approx(expected)
    assert costs[3] == pytest.approx(1 + 0.05 + 1 / 2)  # violation 1 GB: beyond every feasible cost
    assert ACC_LATENCY.scalarized(results, [1.0, 0.0])[:3] == pytest.approx([a * 1.05 for a in acc])


def test_the_gp_tuner_with_several_objectives_learns_the_feasible_region_and_resumes():
    pytest.importorskip("sklearn")
    spec = _spec("GPTuner", cold_start_num=6, selection_num_warm_up=2000, selection_num_starting_points=3, seed=1)
    tuner = create_tuner(spec, SPACE, ACC_LATENCY)
    told = _told(tuner, 18)
    # ParEGO proposals after the random start: infeasible results (memory 16y > 8) cost more than any
    # feasible one, so the model steers away from y > 0.5 whatever weights it draws
    proposed = [p["y"] for p, _ in told[6:]]
    assert sum(y <= 0.5 for y in proposed) >= 10, proposed
    again = create_tuner(spec, SPACE, ACC_LATENCY)
    for number, (params, result) in enumerate(told):
        again.replay(number, params["raw"], result)
    assert len(again.results) == 18 and again.suggest() is not None  # type: ignore[attr-defined]


def test_smac_is_told_one_cost_per_objective_and_infeasible_results_as_the_worst_so_far():
    pytest.importorskip("smac")
    tuner = create_tuner(_spec("SMAC", seed=4), SPACE, ACC_LATENCY)
    told = _told(tuner, 8)
    history = tuner.smac.runhistory  # type: ignore[attr-defined]
    costs = [list(value.cost) for value in history._data.values()]
    worst = None
    for (_, result), cost in zip(told, costs, strict=True):
        if result.feasible:
            assert cost == pytest.approx([-result.values[0], result.values[1]])
            worst = cost if worst is None else [max(w, c) for w, c in zip(worst, cost, strict=True)]
        else:
            assert cost == pytest.approx(worst if worst is not None else [0.0, 0.0])
    assert any(not r.feasible for _, r in told) and any(r.feasible for _, r in told)


def test_grid_search_walks_its_grid_whatever_the_objectives():
    space = {"x": {"_type": "choice", "_value": [1, 2, 3]}, "y": {"_type": "choice", "_value": [0.0, 0.25]}}
    alone = create_tuner(_spec("GridSearch"), space)
    several = create_tuner(_spec("GridSearch"), space, ACC_LATENCY)
    points = []
    while (suggestion := several.suggest()) is not None:
        points.append(suggestion.parameters)
        several.conclude(suggestion.parameter_id, _result(0.5, 1.0), None, True)
    assert points == [alone.suggest().parameters for _ in range(6)] and len(points) == 6


def test_a_single_objective_tuner_is_refused_several_objectives():
    from types import SimpleNamespace

    spec = SimpleNamespace(name="Anneal", class_name=None, class_args={}, code_directory=None)
    with pytest.raises(TunerError, match="cannot tune several objectives; use one of TPE, Random, GridSearch, "
                                         "GPTuner, SMAC, NSGA2, NSGA3"):
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
                                   {"name": "Random", "classArgs": {"seed": 2}},
                                   {"name": "GridSearch"},
                                   {"name": "GPTuner", "classArgs": {"seed": 2, "cold_start_num": 4,
                                                                     "selection_num_warm_up": 500,
                                                                     "selection_num_starting_points": 2}},
                                   {"name": "SMAC", "classArgs": {"seed": 2}}],
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
    assert record.best_trial is None and record.pareto == [t.id for t in result.pareto]  # the audit checks both
    assert pareto_set(store.trials(), ACC_LATENCY) == result.pareto
    # every trial keeps its outcome, one without an objective too
    assert all(t.status == "SUCCEEDED" for t in result.trials)
    # the end event names the Pareto set for automations, and no best trial
    done = wait_for(lambda: _end_event(result.experiment_id), timeout=30)
    assert done["best"] is None and [t["trial"] for t in done["pareto"]] == [t.id for t in result.pareto]


def _end_event(experiment_id: str) -> dict | None:
    """The payload of the experiment's ``done`` event, once the server has it."""
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    with get_client(sync_client=True) as client:
        page = client.read_events(EventFilter(event=EventNameFilter(name=["trialflow.experiment.done"]),
                                              resource=EventResourceFilter(
                                                  id=[f"trialflow.experiment.{experiment_id}"])), limit=5)
    return page.events[0].payload if page.events else None


def _result(accuracy, latency, memory=1.0):
    return ACC_LATENCY.read({"accuracy": accuracy, "latency_ms": latency, "memory_gb": memory})


def test_results_ranked_by_front_then_crowding_then_violation():
    # front 1: a, b, d (b and d are the extremes of both objectives, a between them); c is dominated;
    # e would lead but breaks the memory bound by 1, f by 4
    results = {"a": _result(0.9, 10), "b": _result(0.8, 5), "c": _result(0.7, 20), "d": _result(0.95, 30),
               "e": _result(0.99, 1, memory=9), "f": _result(0.6, 25, memory=12)}
    assert ACC_LATENCY.ranked(results) == ["b", "d", "a", "c", "e", "f"]


def test_moasha_keeps_the_best_of_each_rung_by_dominance_and_constraints():
    from trialflow.assessors import MultiObjectiveAshaAssessor

    assessor = MultiObjectiveAshaAssessor(ACC_LATENCY, min_resource=1, reduction_factor=2)  # rungs at 1, 2, 4
    assert not assessor.assess("t1", [_result(0.5, 10)])  # alone at rung 0
    assert assessor.assess("t2", [_result(0.4, 12)])  # t1 dominates it: 2nd of 2, the best 1 go on
    assert not assessor.assess("t3", [_result(0.6, 9)])  # dominates t1: 1st of 3
    assert assessor.assess("t4", [_result(0.9, 1, memory=9)])  # infeasible: last of 4, the best 2 go on
    assert not assessor.assess("t6", [None])  # no usable result: not judged, nothing recorded
    assert not assessor.assess("t1", [_result(0.5, 10), _result(0.55, 9)])  # alone at rung 1
    assert assessor.assess("t3", [_result(0.6, 9), _result(0.5, 10)])  # at rung 1 t1 dominates it
    # two results at once: rung 0 (1st of 5) and rung 1 (1st of 3) are judged in turn
    assert not assessor.assess("t5", [_result(0.7, 5), _result(0.7, 5)])
    assert set(assessor.rungs[0]) == {"t1", "t2", "t3", "t4", "t5"} and set(assessor.rungs[1]) == {"t1", "t3", "t5"}


def test_moasha_never_stops_a_trial_that_has_trained_to_max_resource():
    from trialflow.assessors import MultiObjectiveAshaAssessor

    assessor = MultiObjectiveAshaAssessor(ACC_LATENCY, min_resource=1, reduction_factor=2, max_resource=4)
    ahead = [_result(0.9, 1)] * 4
    assert not assessor.assess("t1", ahead)  # judged at rungs 1 and 2 only: rung 4 is the end of training
    behind = [_result(0.95, 1), _result(0.95, 1), _result(0.1, 50), _result(0.1, 50)]
    assert not assessor.assess("t2", behind[:3])  # rungs 1 and 2: it dominates t1 there
    assert not assessor.assess("t2", behind)  # its 4th result is far behind t1's, but it has trained fully
    assert set(assessor.rungs) == {0, 1}
    unbounded = MultiObjectiveAshaAssessor(ACC_LATENCY, min_resource=1, reduction_factor=2)
    assert not unbounded.assess("t1", ahead) and unbounded.assess("t2", behind)  # without it, rung 4 judges


def test_moasha_needs_objectives(tmp_path):
    (tmp_path / "code").mkdir()
    with pytest.raises(ConfigError, match="assessor MOASHA ranks several objectives: list them in objectives"):
        parse_config(base_config(tmp_path / "code", tmp_path / "w", assessor={"name": "MOASHA"}))


CURVES = """\
import time, nni
p = nni.get_next_parameter()
x, y = p["x"], p["y"]
for step in range(1, 5):
    time.sleep(0.3)  # a training step
    nni.report_intermediate_result({"default": x * step, "accuracy": x * step, "latency_ms": 10 * x + y,
                                    "memory_gb": 16 * y})
nni.report_final_result({"default": 4 * x, "accuracy": 4 * x, "latency_ms": 10 * x + y, "memory_gb": 16 * y})
"""


def test_moasha_stops_dominated_trials_of_a_running_experiment(tmp_path, prefect_server):
    write_trial(tmp_path / "code", CURVES)
    config = _config(tmp_path, tuner={"name": "Random", "classArgs": {"seed": 4}}, maxTrialNumber=10,
                     trialConcurrency=2, constraints=[{"name": "memory_gb", "max": 8}],
                     assessor={"name": "MOASHA", "classArgs": {"min_resource": 1, "reduction_factor": 2}})
    result = run_experiment(config)
    statuses = [t.status for t in result.trials]
    assert result.status == "DONE" and len(statuses) == 10
    assert "EARLY_STOPPED" in statuses and "SUCCEEDED" in statuses, statuses
    assert all(t.message for t in result.trials if t.status == "EARLY_STOPPED")  # saying who stopped it
    assert result.pareto and all(t.status == "SUCCEEDED" for t in result.pareto)


@pytest.mark.breaks_records
def test_the_audit_checks_the_recorded_pareto_set(tmp_path):
    from trialflow.experiments import create_experiment
    from trialflow.experiments.results import end_experiment
    from trialflow.records.store import ExperimentStore, Metric
    from trialflow.testing.audit import check_experiment

    exp_id, exp_dir = create_experiment(parse_config(_config(tmp_path, maxTrialNumber=3,
                                                             constraints=[{"name": "memory_gb", "max": 8}])))
    store = ExperimentStore.embedded(exp_dir, exp_id)
    finals = {"AAAAA": (0.9, 10, 1), "BBBBB": (0.8, 20, 1), "CCCCC": (0.99, 1, 9)}  # B dominated, C infeasible
    for i, (tid, (acc, lat, mem)) in enumerate(finals.items()):
        store.add_trial(tid, None, i, {"x": 0.5, "y": 0.5}, {"x": 0.5, "y": 0.5})
        store.set_status(tid, "RUNNING", when=1.0 + i)
        store.add_metrics([Metric(tid, "FINAL", 0, {"accuracy": acc, "latency_ms": lat, "memory_gb": mem}, 2.0 + i)])
        store.set_status(tid, "SUCCEEDED", exit_code=0, when=3.0 + i)
    end_experiment(store, "DONE")
    assert store.experiment().pareto == ["AAAAA"] and store.experiment().best_trial is None
    assert check_experiment(exp_dir) == []
    store.set_experiment(pareto=["AAAAA", "CCCCC"], best_trial="CCCCC")
    problems = "\n".join(check_experiment(exp_dir))
    assert "recorded Pareto set ['AAAAA', 'CCCCC'] but the non-dominated feasible trials are ['AAAAA']" in problems
    assert "recorded best trial CCCCC but the best under maximize is None" in problems


def _cli(*args: str):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "trialflow.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=180)


def test_views_exports_and_imports_of_a_multi_objective_experiment(tmp_path, prefect_server):
    import csv
    import json

    write_trial(tmp_path / "code", TRIAL)
    result = run_experiment(_config(tmp_path, tuner={"name": "TPE", "classArgs": {"seed": 5}}, maxTrialNumber=6,
                                    trialConcurrency=3, constraints=[{"name": "memory_gb", "max": 8}]))
    exp, root, front = result.experiment_id, str(tmp_path / "w"), {t.id for t in result.pareto}
    listing = _cli("trial", "ls", exp, "--root", root)
    assert listing.returncode == 0, listing.stderr
    header = next(line for line in listing.stdout.splitlines() if "trial" in line and "status" in line).split()
    assert header[:6] == ["trial", "#", "status", "accuracy", "latency_ms", "pareto"]
    marked = {line.split()[0] for line in listing.stdout.splitlines() if line.split()[:1] and
              line.split()[0] in {t.id for t in result.trials} and " * " in f" {line} "}
    assert marked == front
    head = _cli("trial", "ls", exp, "--root", root, "--head", "1")
    assert [line.split()[0] for line in head.stdout.splitlines() if line.split()[:1] and line.split()[0] in
            {t.id for t in result.trials}] in ([t.id] for t in result.pareto)  # the first of the ranked front
    view = _cli("view", exp, "--root", root)
    assert f"Pareto set: {len(front)} trial" in view.stdout and "best trial" not in view.stdout
    assert all(i in view.stdout for i in front)
    assert _cli("experiment", "export", exp, "--root", root, "-f", str(tmp_path / "r.csv"), "-t", "csv").returncode == 0
    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"accuracy", "latency_ms", "memory_gb", "pareto"} <= set(rows[0])
    assert {r["trialJobId"] for r in rows if r["pareto"] == "True"} == front
    assert _cli("experiment", "export", exp, "--root", root, "-f", str(tmp_path / "r.json")).returncode == 0
    exported = json.loads((tmp_path / "r.json").read_text())
    assert {r["trialJobId"] for r in exported if r["pareto"]} == front
    # the exported rows go back in as importData; a row without the objectives is refused, naming them
    usable = [r for r in exported if "latency_ms" in json.loads(r["value"])]
    (tmp_path / "usable.json").write_text(json.dumps(usable))
    imported = _cli("experiment", "import", exp, "--root", root, "-f", str(tmp_path / "usable.json"))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert len(open_store(tmp_path / "w", exp).imported()) == len(usable) > 0
    (tmp_path / "bad.json").write_text(json.dumps([{"parameter": {"x": 0.5, "y": 0.5}, "value": 0.5}]))
    refused = _cli("experiment", "import", exp, "--root", root, "-f", str(tmp_path / "bad.json"))
    assert refused.returncode != 0
    assert "item 0: 'value' must be a dict with the objectives accuracy, latency_ms" in refused.stdout + refused.stderr


def test_a_csv_export_of_trials_without_results_has_no_reward_column(tmp_path):
    import csv
    import json

    from trialflow.experiments.result_exchange import write_csv

    rows = [{"parameter": {"x": 1}, "value": json.dumps({"accuracy": 0.9, "latency_ms": 3}), "trialJobId": "A",
             "status": "SUCCEEDED", "pareto": True},
            {"parameter": {"x": 2}, "value": None, "trialJobId": "B", "status": "EARLY_STOPPED", "pareto": False}]
    write_csv(tmp_path / "r.csv", rows)
    with open(tmp_path / "r.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == ["x", "accuracy", "latency_ms", "trialJobId", "status", "pareto"]
    assert read[1]["accuracy"] == "" and read[1]["status"] == "EARLY_STOPPED"


def test_hypervolume_of_hand_computed_fronts():
    from trialflow.tuners.objectives import hypervolume

    both_min = Objectives((Objective("a", False), Objective("b", False)))
    assert hypervolume(both_min, [(1, 3), (2, 2), (3, 1)], (4, 4)) == 6.0  # three 1x3 strips, overlapping
    assert hypervolume(both_min, [(1, 3), (2, 2), (5, 0)], (4, 4)) == 5.0  # (5, 0) is beyond the reference
    assert hypervolume(Objectives((Objective("acc", True), Objective("lat", False))), [(3, 1)], (0, 4)) == 9.0
    three = Objectives(tuple(Objective(n, False) for n in "abc"))
    assert hypervolume(three, [(0, 0, 1), (1, 1, 0)], (2, 2, 2)) == 5.0  # 4 + 2 - their common 1


def test_the_report_of_a_multi_objective_experiment_draws_its_front_and_hypervolume(tmp_path):
    from trialflow.experiments import create_experiment
    from trialflow.experiments.results import end_experiment
    from trialflow.presentation.report import charts
    from trialflow.records.store import ExperimentStore, Metric

    exp_id, exp_dir = create_experiment(parse_config(_config(tmp_path, maxTrialNumber=4,
                                                             constraints=[{"name": "memory_gb", "max": 8}])))
    store = ExperimentStore.embedded(exp_dir, exp_id)
    finals = {"AAAAA": (0.7, 5, 1), "BBBBB": (0.6, 20, 1), "CCCCC": (0.9, 10, 1), "DDDDD": (0.99, 1, 9)}
    for i, (tid, (acc, lat, mem)) in enumerate(finals.items()):
        store.add_trial(tid, None, i, {"x": 0.1 * i, "y": 0.5}, {"x": 0.1 * i, "y": 0.5})
        store.set_status(tid, "RUNNING", when=1.0 + i)
        store.add_metrics([Metric(tid, "FINAL", 0, {"default": acc, "accuracy": acc, "latency_ms": lat,
                                                    "memory_gb": mem}, 2.0 + i)])
        store.set_status(tid, "SUCCEEDED", exit_code=0, when=3.0 + i)
    end_experiment(store, "DONE")
    drawn = dict(charts(store, store.trials()))
    front = {trace.name: trace for trace in drawn["Pareto front"].data}
    assert list(front["Pareto set"].text) == ["AAAAA", "CCCCC"]  # by accuracy, the x axis
    assert list(front["dominated"].text) == ["BBBBB"] and list(front["infeasible (breaks a constraint)"].text) == \
        ["DDDDD"]
    volumes = list(drawn["Hypervolume over trials"].data[0].y)
    assert list(drawn["Hypervolume over trials"].data[0].x) == [0, 1, 2]  # the feasible trials
    assert volumes[0] > 0 and volumes[1] == volumes[0] and volumes[2] > volumes[1]  # B adds nothing, C does


def test_the_optuna_mirror_of_a_multi_objective_experiment_has_its_directions_values_and_constraints(tmp_path):
    import optuna

    from trialflow.experiments import create_experiment
    from trialflow.presentation.dashboard import open_mirror
    from trialflow.records.store import Metric

    exp_id, exp_dir = create_experiment(parse_config(_config(tmp_path, maxTrialNumber=5,
                                                                   constraints=[{"name": "memory_gb", "max": 8}])))
    store = open_store(exp_dir.parent, exp_id)
    finals = {"A": {"accuracy": 0.9, "latency_ms": 20, "memory_gb": 4}, "B": {"accuracy": 0.8, "latency_ms": 10,
              "memory_gb": 2}, "C": {"accuracy": 0.7, "latency_ms": 30, "memory_gb": 1},
              "D": {"accuracy": 0.99, "latency_ms": 1, "memory_gb": 12}, "E": {"accuracy": 0.5}}
    for sequence, (trial, final) in enumerate(finals.items()):
        store.add_trial(trial, None, sequence, {"x": 0.1 * sequence, "y": 0.5}, {})
        store.set_status(trial, "RUNNING")
        store.add_metrics([Metric(trial, "PERIODICAL", 0, {"default": 0.5, **final}), Metric(trial, "FINAL", 0, final)])
        store.set_status(trial, "SUCCEEDED", 0)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    assert open_mirror(store, url, "mo").sync() == 5
    study = optuna.load_study(study_name="mo", storage=url)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"] and study.metric_names == TWO_NAMES
    trials = {t.user_attrs["trialflow_trial_id"]: t for t in study.trials}
    assert trials["A"].values == [0.9, 20.0] and trials["A"].system_attrs["constraints"] == [-4.0]
    assert trials["D"].system_attrs["constraints"] == [4.0]  # infeasible: 12 GB against a bound of 8
    assert trials["E"].state == optuna.trial.TrialState.FAIL  # its result lacks an objective
    assert trials["A"].intermediate_values == {0: 0.5}  # a dict's default, as NNI reads it
    # Optuna's own Pareto front (which leaves infeasible trials out) is the experiment's Pareto set
    assert sorted(t.user_attrs["trialflow_trial_id"] for t in study.best_trials) == \
        sorted(t.id for t in pareto_set(store.trials(), ACC_LATENCY)) == ["A", "B"]


def test_the_multi_objective_example_config_is_valid():
    """examples/multi-objective, as the README points to it (run by hand: it trains real networks)."""
    from pathlib import Path

    from trialflow.config import load_config

    config = load_config(Path(__file__).parent.parent / "examples" / "multi-objective" / "config.yml")
    assert config.multi_objective.names == ["accuracy", "size_k"]
    assert config.assessor.name == "MOASHA" and config.tuner.name == "TPE"
