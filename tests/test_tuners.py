"""Tuners and assessors: quality, NNI semantics, classArgs validation, replay for resume."""

from __future__ import annotations

import random
import statistics

import pytest

from trialflow.assessors import CurvefittingAssessor, MedianstopAssessor, create_assessor
from trialflow.config import AlgorithmConfig
from trialflow.records.search_space import parse_search_space
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


# NNI's own "advanced config" of its TPE tuner (nni/algorithms/hpo/tpe_tuner.py)
NNI_TPE_ARGS = {"constant_liar_type": "mean", "n_startup_jobs": 10, "n_ei_candidates": 20, "linear_forgetting": 100,
                "prior_weight": 0, "gamma": 0.5}


def test_nnis_tpe_args_configure_the_search():
    """NNI's tpe_args work unchanged; with n_startup_jobs above the trials run, every suggestion is the
    random stage's, so the same seed with n_startup_jobs 3 diverges from it after the third."""
    def run(tpe_args):
        tuner = create_tuner(AlgorithmConfig(name="TPE", class_args={"seed": 5, "tpe_args": tpe_args}),
                             parse_search_space(QUAD))
        rng, seen = random.Random(3), []
        for _ in range(12):
            s = tuner.suggest()
            tuner.observe(s.parameter_id, _noisy_quadratic(s.parameters, rng))
            seen.append(s.parameters)
        return seen

    nni, random_only, early = run(NNI_TPE_ARGS), run({"n_startup_jobs": 50}), run({"n_startup_jobs": 3})
    assert len(nni) == 12
    assert early[:3] == random_only[:3] and early[3:] != random_only[3:]


def _window_tuner(window, seed=2):
    from trialflow.tuners.optuna_tuners import OptunaTuner
    from trialflow.tuners.tpe import TpeSettings

    settings = TpeSettings({"n_startup_jobs": 5})
    return OptunaTuner(parse_search_space(QUAD), settings.sampler, "minimize", seed, None, window)


def test_the_history_window_bounds_the_study_and_keeps_the_best_and_running_trials():
    """Past the window, the tuner's study holds the best trials, the recent ones and every running trial:
    trials suggested before a rebuild and told after it land in the new study."""
    from optuna.trial import TrialState

    tuner, rng, best, running = _window_tuner((40, 5)), random.Random(9), [], []
    for step in range(300):
        running.append(tuner.suggest())
        if len(running) == 4 or step == 299:  # four at a time, told newest first
            for s in reversed(running):
                value = _noisy_quadratic(s.parameters, rng)
                tuner.observe(s.parameter_id, value)
                best = sorted([*best, value])[:5]
            running = []
        study = tuner.study.get_trials(deepcopy=False)
        assert len(study) <= 40 + 4 + 1
        assert sum(t.state == TrialState.RUNNING for t in study) == len(running)
    values = sorted(t.value for t in tuner.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    assert values[:5] == best
    assert not tuner._pending


@pytest.mark.parametrize("tpe_args,held", [({}, 1000), ({"history_window": 0}, 1100), ({"history_window": 200}, 200)])
def test_tpe_holds_its_history_window_unless_told_otherwise(tpe_args, held):
    tuner = create_tuner(AlgorithmConfig(name="TPE", class_args={"seed": 1, "tpe_args": tpe_args}),
                         parse_search_space(QUAD))
    rng = random.Random(4)
    for i in range(1100):
        raw = {f"x{k}": rng.random() for k in range(5)}
        tuner.replay(i, raw, rng.random())
    assert max(held - 600, 0) < len(tuner.study.get_trials(deepcopy=False)) <= held


def test_a_windowed_tuner_is_reproducible_from_its_seed_and_after_a_replay():
    def run(tuner, n):
        rng, seen = random.Random(1), []
        for _ in range(n):
            s = tuner.suggest()
            tuner.observe(s.parameter_id, _noisy_quadratic(s.parameters, rng))
            seen.append((s.parameter_id, s.raw, s.parameters))
        return seen

    first, second = run(_window_tuner((30, 5)), 90), run(_window_tuner((30, 5)), 90)
    assert first == second
    resumed, rng = _window_tuner((30, 5)), random.Random(1)
    for pid, raw, params in first:
        resumed.replay(pid, raw, _noisy_quadratic(params, rng))
    assert len(resumed.study.get_trials(deepcopy=False)) <= 31 and resumed.suggest().parameter_id == 90


@pytest.mark.parametrize("config,message", [
    (AlgorithmConfig(name="Hyperopt"), "unknown tuner 'Hyperopt'"),
    (AlgorithmConfig(name="TPE", class_args={"optimize_mode": "up"}), "classArgs.optimize_mode must be"),
    (AlgorithmConfig(name="TPE", class_args={"seeds": 1}), "unknown classArgs key 'seeds'; allowed: optimize_mode"),
    (AlgorithmConfig(name="Evolution", class_args={"population_size": 0}), "population_size must be a positive"),
    (AlgorithmConfig(name="GridSearch", class_args={"seed": 1}), "unknown classArgs key 'seed'"),
    (AlgorithmConfig(name="TPE", class_args={"tpe_args": {"linear_forgeting": 9}}),
     "classArgs.tpe_args has unknown key 'linear_forgeting'; allowed: constant_liar_type, n_startup_jobs"),
    (AlgorithmConfig(name="TPE", class_args={"tpe_args": {"constant_liar_type": "median"}}),
     "key 'constant_liar_type' must be best, worst, mean or null"),
    (AlgorithmConfig(name="TPE", class_args={"tpe_args": {"history_window": 10}}),
     "key 'history_window' must be 0 \\(the whole history\\) or an integer of at least 100"),
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


def test_curvefitting_judges_a_step_of_its_schedule_that_results_read_together_went_past():
    a = CurvefittingAssessor(epoch_num=20, start_step=4, gap=3, threshold=0.95)
    a.trial_end("t1", [0.5 + 0.1 * i for i in range(20)], True)
    low = [0.1, 0.12, 0.13, 0.14, 0.145, 0.15, 0.152, 0.154]
    assert not a.assess("t2", low[:3])
    assert a.assess("t2", low[:5])  # step 4 (a judged step) came with step 5
    assert not a.assess("t2", low[:6])  # step 6 is not one: judged again at 7
    assert a.assess("t2", low[:7])


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
from trialflow.records.search_space import parse_search_space
from trialflow.tuners import optuna_tuners
tuner = optuna_tuners.OptunaTuner(parse_search_space({"x": {"_type": "uniform", "_value": [0, 1]}}),
                                  optuna_tuners.random_sampler, seed=0)
tuner.observe(tuner.suggest().parameter_id, 0.5)
print(optuna.logging.get_verbosity() == logging.INFO)
"""
    done = subprocess.run([sys.executable, "-c", notebook], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stdout + done.stderr
    assert "A new study created" not in done.stderr  # trialflow's own studies stay quiet
