"""Search spaces: NNI's validation rules and sampling semantics, checked for every tuner."""

from __future__ import annotations

import math
import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trialflow.config import AlgorithmConfig
from trialflow.records.search_space import ReplayChooser, SearchSpaceError, grid_points, parse_search_space
from trialflow.tuners import create_tuner
from trialflow.tuners.base import RandomChooser


@pytest.mark.parametrize("space,message", [
    ([], "must be a JSON object"),
    ({"a": 1}, 'parameter "a": must be an object with "_type" and "_value"'),
    ({"a": {"_type": "gaussian", "_value": [0, 1]}}, "unknown _type 'gaussian'"),
    ({"a": {"_type": "uniform", "_value": 3}}, "_value must be a list"),
    ({"a": {"_type": "uniform", "_value": [1]}}, "uniform needs 2 values in _value, got 1"),
    ({"a": {"_type": "quniform", "_value": [0, 1]}}, "quniform needs 3 values in _value, got 2"),
    ({"a": {"_type": "uniform", "_value": [2, 1]}}, "uniform needs low < high, got 2 >= 1"),
    ({"a": {"_type": "loguniform", "_value": [0, 1]}}, "loguniform needs low > 0"),
    ({"a": {"_type": "normal", "_value": [0, 0]}}, "normal needs sigma > 0"),
    ({"a": {"_type": "randint", "_value": [0.5, 3]}}, "randint bounds must be integers"),
    ({"a": {"_type": "quniform", "_value": [0, 1, 0]}}, "quniform needs q > 0"),
    ({"a": {"_type": "uniform", "_value": [0, "x"]}}, "uniform values must be finite numbers"),
    ({"a": {"_type": "choice", "_value": []}}, "choice needs at least one option"),
    ({"a": {"_type": "choice", "_value": [{"_name": "x"}, {"y": 1}]}}, 'every nested choice option needs "_name"'),
    ({"a": {"_type": "choice", "_value": [{"_name": "x", "b": {"_type": "uniform", "_value": [1, 0]}}]}},
     'parameter "a/x/b": uniform needs low < high'),
    ({"a": {"_type": "uniform", "_value": [0, 1], "_extra": 1}}, "unknown keys ['_extra']"),
])
def test_validation_names_parameter_and_rule(space, message):
    with pytest.raises(SearchSpaceError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_search_space(space)


def _sample_many(raw_space, n=2000, seed=0):
    space = parse_search_space(raw_space)
    rng = random.Random(seed)
    return [space.sample(RandomChooser(rng))["a"] for _ in range(n)]


def test_randint_upper_bound_is_exclusive():
    values = _sample_many({"a": {"_type": "randint", "_value": [2, 5]}})
    assert set(values) == {2, 3, 4} and all(isinstance(v, int) for v in values)


def test_quniform_rounds_and_clips():
    assert set(_sample_many({"a": {"_type": "quniform", "_value": [0, 10, 2.5]}})) == {0, 2.5, 5, 7.5, 10}
    assert set(_sample_many({"a": {"_type": "quniform", "_value": [2, 10, 5]}})) == {2, 5, 10}


def test_qnormal_is_not_clipped_and_qlognormal_is_quantised():
    values = _sample_many({"a": {"_type": "qnormal", "_value": [0, 5, 2]}})
    assert all(v % 2 == 0 for v in values) and min(values) < -6 and max(values) > 6
    assert all(v >= 0 and round(v / 3, 9).is_integer() for v in
               _sample_many({"a": {"_type": "qlognormal", "_value": [1, 1, 3]}}))


def test_normal_has_the_declared_mean_and_spread():
    values = _sample_many({"a": {"_type": "normal", "_value": [10, 2]}}, n=4000)
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    assert abs(mean - 10) < 0.15 and abs(sd - 2) < 0.15


def test_loguniform_is_uniform_in_log_space():
    values = _sample_many({"a": {"_type": "loguniform", "_value": [1e-4, 1]}}, n=4000)
    below = sum(v < 1e-2 for v in values) / len(values)
    assert 0.45 < below < 0.55


def test_nested_choice_returns_name_and_sub_parameters():
    space = parse_search_space({"a": {"_type": "choice", "_value": [
        {"_name": "svm", "C": {"_type": "uniform", "_value": [0.1, 10]}}, {"_name": "tree"}]}})
    seen = {v["_name"]: v for v in (space.sample(RandomChooser(random.Random(i)))["a"] for i in range(40))}
    assert set(seen) == {"svm", "tree"}
    assert 0.1 <= seen["svm"]["C"] <= 10 and seen["tree"] == {"_name": "tree"}


def test_grid_is_exactly_the_expected_grid():
    space = parse_search_space({"a": {"_type": "choice", "_value": ["x", "y"]},
                                "b": {"_type": "randint", "_value": [0, 3]},
                                "c": {"_type": "quniform", "_value": [2, 10, 5]}})
    points = [space.sample(ReplayChooser(p)) for p in grid_points(space)]
    expected = [{"a": a, "b": b, "c": c} for a in "xy" for b in range(3) for c in (2.0, 5.0, 10.0)]
    assert points == expected


def test_grid_refines_continuous_types_midpoint_first():
    space = parse_search_space({"u": {"_type": "uniform", "_value": [0, 8]}})
    gen = grid_points(space)
    firsts = [space.sample(ReplayChooser(next(gen)))["u"] for _ in range(7)]
    assert firsts == [4.0, 2.0, 6.0, 1.0, 3.0, 5.0, 7.0]



def test_grid_search_over_a_grid_too_large_to_hold_suggests_its_first_points():
    """Three quantised parameters of ~2,300 values each make a grid of ~12 billion points: GridSearch
    walks it point by point, in NNI's order, holding only what it suggested."""
    fine = {"_type": "qloguniform", "_value": [34.8, 57.7, 0.01]}
    space = parse_search_space({"a": fine, "b": fine, "c": fine})
    tracemalloc.start()
    try:
        tuner = create_tuner(AlgorithmConfig(name="GridSearch"), space)
        points = [tuner.suggest().parameters for _ in range(5)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024, f"{peak} bytes held for five points"
    assert [p["c"] for p in points] == pytest.approx([34.8, 34.81, 34.82, 34.83, 34.84])
    assert all(p["a"] == p["b"] == pytest.approx(34.8) for p in points)

# ---- property: every tuner's samples stay in their declared domain ---------------------------

numbers = st.floats(min_value=-100, max_value=100, allow_nan=False, allow_infinity=False)


@st.composite
def param_specs(draw, depth=0):
    kind = draw(st.sampled_from(["choice", "randint", "uniform", "quniform", "loguniform", "qloguniform",
                                 "normal", "qnormal", "lognormal", "qlognormal"]
                                + (["nested"] if depth == 0 else [])))
    if kind == "nested":
        options = [{"_name": f"o{i}", **draw(spaces(depth + 1))} for i in range(draw(st.integers(1, 3)))]
        return {"_type": "choice", "_value": options}
    if kind == "choice":
        return {"_type": "choice", "_value": draw(st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=3)),
                                                           min_size=1, max_size=4, unique=True))}
    if kind == "randint":
        low = draw(st.integers(-50, 50))
        return {"_type": "randint", "_value": [low, low + draw(st.integers(1, 20))]}
    if kind in ("normal", "qnormal", "lognormal", "qlognormal"):
        mu = draw(st.floats(-3, 3)) if "log" in kind else draw(numbers)
        value = [mu, draw(st.floats(0.01, 2))]
        return {"_type": kind, "_value": value + ([draw(st.floats(0.1, 5))] if kind.startswith("q") else [])}
    low = draw(st.floats(0.001, 50)) if "log" in kind else draw(numbers)
    high = low + draw(st.floats(0.01, 50))
    return {"_type": kind, "_value": [low, high] + ([draw(st.floats(0.01, 10))] if kind.startswith("q") else [])}


@st.composite
def spaces(draw, depth=0):
    names = draw(st.lists(st.sampled_from(list("abcdef")), min_size=1, max_size=4, unique=True))
    return {n: draw(param_specs(depth)) for n in names}


def _check(spec, value):
    kind, v = spec["_type"], spec["_value"]
    if kind == "choice":
        if isinstance(v[0], dict):
            option = next(o for o in v if o["_name"] == value["_name"])
            sub = {k: s for k, s in option.items() if k != "_name"}
            assert set(value) == {"_name", *sub}
            for name, s in sub.items():
                _check(s, value[name])
        else:
            assert value in v
    elif kind == "randint":
        assert isinstance(value, int) and v[0] <= value < v[1]
    else:
        assert isinstance(value, float) and math.isfinite(value)
        if kind in ("uniform", "quniform", "loguniform", "qloguniform"):
            assert v[0] - 1e-9 <= value <= v[1] + 1e-9
        if kind in ("lognormal", "qlognormal", "loguniform"):
            assert value >= 0
        if kind.startswith("q") and not (kind in ("quniform", "qloguniform") and value in (v[0], v[1])):
            ratio = value / v[2]
            assert abs(ratio - round(ratio)) < 1e-6


TUNER_NAMES = ["TPE", "Random", "Anneal", "Evolution", "GridSearch", "CMAES"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=spaces(), seed=st.integers(0, 1000))
def test_every_tuner_samples_inside_the_declared_domain(raw, seed):
    space = parse_search_space(raw)
    for name in TUNER_NAMES:
        args = {} if name == "GridSearch" else {"seed": seed}
        if name == "Evolution":
            args["population_size"] = 4
        tuner = create_tuner(AlgorithmConfig(name=name, class_args=args), space)
        for i in range(12):
            suggestion = tuner.suggest()
            if suggestion is None:
                break
            assert set(suggestion.parameters) == set(raw)
            for key, spec in raw.items():
                _check(spec, suggestion.parameters[key])
            tuner.observe(suggestion.parameter_id, float(i % 5))


def test_choice_values_may_be_any_json_value_and_dicts_without_name_are_plain():
    # NNI's BatchTuner example: each option a whole parameter set
    options = [{"optimizer": "Adam", "learning_rate": 1e-5}, {"optimizer": "SGD", "learning_rate": 0.01},
               [1, 2], None]
    space = parse_search_space({"combine_params": {"_type": "choice", "_value": options}})
    tuner = create_tuner(AlgorithmConfig(name="Batch"), space)
    seen = []
    while (suggestion := tuner.suggest()) is not None:
        seen.append(suggestion.parameters["combine_params"])
        tuner.observe(suggestion.parameter_id, 1.0)
    assert seen == options
    assert space.encode({"combine_params": options[1]}) == {"combine_params": 1}
    random_pick = create_tuner(AlgorithmConfig(name="Random"), space).suggest().parameters["combine_params"]
    assert random_pick in options
