"""Tuners and assessors: quality, NNI semantics, classArgs validation, replay for resume."""

from __future__ import annotations

import random
import statistics

import pytest

from trialflow.assessors import CurvefittingAssessor, MedianstopAssessor, create_assessor
from trialflow.config import AlgorithmConfig
from trialflow.search_space import parse_search_space
from trialflow.tuners import InvalidMetric, TunerError, create_tuner, extract_scalar

QUAD = {f"x{i}": {"_type": "uniform", "_value": [-5, 5]} for i in range(5)}


def _noisy_quadratic(params, rng):
    return sum((params[f"x{i}"] - (i - 2)) ** 2 for i in range(5)) + rng.gauss(0, 0.5)


def _best_after(name, seed, trials=100):
    tuner = create_tuner(AlgorithmConfig(name=name, class_args={"seed": seed}), parse_search_space(QUAD))
    rng = random.Random(1000 + seed)
    best = float("inf")
    for _ in range(trials):
        s = tuner.suggest()
        value = _noisy_quadratic(s.parameters, rng)
        tuner.observe(s.parameter_id, value)
        best = min(best, value)
    return best


def test_tpe_beats_random_on_a_noisy_quadratic():
    tpe = statistics.median(_best_after("TPE", seed) for seed in range(10))
    rnd = statistics.median(_best_after("Random", seed) for seed in range(10))
    assert tpe < rnd, (tpe, rnd)


def test_same_seed_same_suggestions():
    space = parse_search_space(QUAD)
    for name in ("TPE", "Random", "Anneal", "Evolution"):
        runs = []
        for _ in range(2):
            t = create_tuner(AlgorithmConfig(name=name, class_args={"seed": 7}), space)
            seq = []
            for i in range(15):
                s = t.suggest()
                t.observe(s.parameter_id, float(i))
                seq.append(s.parameters)
            runs.append(seq)
        assert runs[0] == runs[1], name


NESTED = {"model": {"_type": "choice", "_value": [
    {"_name": "svm", "C": {"_type": "loguniform", "_value": [0.01, 10]},
     "kernel": {"_type": "choice", "_value": ["rbf", "linear"]}},
    {"_name": "forest", "depth": {"_type": "randint", "_value": [2, 6]}}]},
    "lr": {"_type": "quniform", "_value": [0, 1, 0.5]}}


@pytest.mark.parametrize("name", ["TPE", "Random", "GridSearch", "Anneal", "Evolution"])
def test_nested_choice_with_each_tuner(name):
    args = {} if name == "GridSearch" else {"seed": 3}
    if name == "Evolution":
        args["population_size"] = 5
    tuner = create_tuner(AlgorithmConfig(name=name, class_args=args), parse_search_space(NESTED))
    seen = set()
    for _ in range(40):
        s = tuner.suggest()
        if s is None:
            break
        model = s.parameters["model"]
        seen.add(model["_name"])
        if model["_name"] == "svm":
            assert set(model) == {"_name", "C", "kernel"} and 0.01 <= model["C"] <= 10
        else:
            assert set(model) == {"_name", "depth"} and 2 <= model["depth"] < 6
        tuner.observe(s.parameter_id, float(model.get("depth", 1)))
    assert seen == {"svm", "forest"}


def test_grid_search_is_exhausted_after_the_grid():
    space = parse_search_space({"a": {"_type": "choice", "_value": [1, 2, 3]}, "b": {"_type": "randint",
                                                                                   "_value": [0, 2]}})
    tuner = create_tuner(AlgorithmConfig(name="GridSearch"), space)
    got = []
    while (s := tuner.suggest()) is not None:
        got.append((s.parameters["a"], s.parameters["b"]))
    assert got == [(a, b) for a in (1, 2, 3) for b in (0, 1)]


def test_replay_skips_done_grid_points_and_continues_ids():
    space = parse_search_space({"a": {"_type": "choice", "_value": [1, 2, 3]}})
    first = create_tuner(AlgorithmConfig(name="GridSearch"), space)
    done = [first.suggest() for _ in range(2)]
    resumed = create_tuner(AlgorithmConfig(name="GridSearch"), space)
    for s in done:
        resumed.replay(s.parameter_id, s.raw, 1.0)
    nxt = resumed.suggest()
    assert nxt.parameters == {"a": 3} and nxt.parameter_id == 2 and resumed.suggest() is None


def test_optuna_tuner_replay_rebuilds_the_study():
    space = parse_search_space(QUAD)
    tuner = create_tuner(AlgorithmConfig(name="TPE", class_args={"seed": 1}), space)
    s = tuner.suggest()
    fresh = create_tuner(AlgorithmConfig(name="TPE", class_args={"seed": 1}), space)
    fresh.replay(s.parameter_id, s.raw, 3.0)
    assert fresh.study.trials[0].value == 3.0 and fresh.suggest().parameter_id == s.parameter_id + 1


@pytest.mark.parametrize("config,message", [
    (AlgorithmConfig(name="Hyperopt"), "unknown tuner 'Hyperopt'"),
    (AlgorithmConfig(name="TPE", class_args={"optimize_mode": "up"}), "classArgs.optimize_mode must be"),
    (AlgorithmConfig(name="TPE", class_args={"seeds": 1}), "unknown classArgs key 'seeds'; allowed: optimize_mode"),
    (AlgorithmConfig(name="Evolution", class_args={"population_size": 0}), "population_size must be a positive"),
    (AlgorithmConfig(name="GridSearch", class_args={"seed": 1}), "unknown classArgs key 'seed'"),
])
def test_class_args_are_validated(config, message):
    with pytest.raises(TunerError, match=message):
        create_tuner(config, parse_search_space(QUAD))


def test_batch_tuner_needs_a_single_choice():
    with pytest.raises(TunerError, match="single 'choice'"):
        create_tuner(AlgorithmConfig(name="Batch"), parse_search_space(QUAD))
    space = parse_search_space({"cfg": {"_type": "choice", "_value": [1, 2]}})
    tuner = create_tuner(AlgorithmConfig(name="BatchTuner"), space)
    assert [tuner.suggest().parameters, tuner.suggest().parameters, tuner.suggest()] == [{"cfg": 1}, {"cfg": 2}, None]


@pytest.mark.parametrize("value,expected", [(1, 1.0), (2.5, 2.5), ({"default": 3, "x": "y"}, 3.0)])
def test_scalar_extraction(value, expected):
    assert extract_scalar(value) == expected


@pytest.mark.parametrize("value", ["1.0", None, {"loss": 1}, float("nan"), float("inf"), True, [1]])
def test_invalid_metrics(value):
    with pytest.raises(InvalidMetric):
        extract_scalar(value)


def test_medianstop_semantics():
    a = MedianstopAssessor(optimize_mode="maximize", start_step=1)
    a.trial_end("t1", [1.0, 2.0, 3.0], True)   # running averages 1, 1.5, 2
    a.trial_end("t2", [3.0, 3.0, 3.0], True)   # 3, 3, 3
    assert not a.assess("t3", [5.0])             # at or before start_step
    assert not a.assess("t3", [5.0, 2.0])        # best 5 vs median 2.25
    assert a.assess("t4", [1.0, 2.0])            # best 2 < median 2.25
    m = MedianstopAssessor(optimize_mode="minimize")
    m.trial_end("t1", [1.0], True)
    assert m.assess("t2", [2.0]) and not m.assess("t3", [0.5])


def test_curvefitting_stops_a_curve_heading_below_threshold():
    a = CurvefittingAssessor(epoch_num=20, start_step=4, threshold=0.95)
    good = [0.5 + 0.1 * i for i in range(20)]
    a.trial_end("t1", good, True)
    assert a.assess("t2", [0.1, 0.12, 0.13, 0.14])
    assert not a.assess("t3", good[:6])
    assert not a.assess("t4", [0.1, 0.2, 0.3])  # before start_step


def test_assessor_args_validated():
    with pytest.raises(TunerError, match="unknown assessor"):
        create_assessor(AlgorithmConfig(name="Nope"))
    with pytest.raises(TunerError, match="start_step must be a non-negative integer"):
        create_assessor(AlgorithmConfig(name="Medianstop", class_args={"start_step": -1}))


def test_importing_and_using_the_optuna_tuners_leaves_optunas_verbosity_as_the_user_set_it():
    import subprocess
    import sys

    notebook = """
import logging, optuna
optuna.logging.set_verbosity(logging.INFO)  # the user's own choice, before trialflow is imported
from trialflow.search_space import parse_search_space
from trialflow.tuners import optuna_tuners
tuner = optuna_tuners.OptunaTuner(parse_search_space({"x": {"_type": "uniform", "_value": [0, 1]}}),
                                  optuna_tuners.random_sampler(0))
tuner.observe(tuner.suggest().parameter_id, 0.5)
print(optuna.logging.get_verbosity() == logging.INFO)
"""
    done = subprocess.run([sys.executable, "-c", notebook], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stdout + done.stderr
    assert "A new study created" not in done.stderr  # trialflow's own studies stay quiet
