"""What a tracker is told of a trial's parameters and results: the names match the Optuna dashboard's
mirror of the same trial; only finite numbers are results. Pure functions, no tracker."""

from __future__ import annotations

import math

from trialflow.presentation.optuna_mirror import flatten
from trialflow.records.search_space import parse_search_space
from trialflow.tracking.values import as_text, flat_parameters, numbers

SPACE = {
    "lr": {"_type": "loguniform", "_value": [1e-4, 1.0]},
    "model": {"_type": "choice", "_value": [
        {"_name": "svm", "C": {"_type": "uniform", "_value": [0.1, 10]},
         "kernel": {"_type": "choice", "_value": ["rbf", "linear"]}},
        {"_name": "tree", "depth": {"_type": "randint", "_value": [2, 8]}},
    ]},
}


def test_a_nested_choice_is_named_as_the_dashboard_names_it():
    params = {"lr": 0.01, "model": {"_name": "svm", "C": 2.5, "kernel": "rbf"}}
    mirrored, _, misfits = flatten(parse_search_space(SPACE), params)
    assert misfits == {}
    assert flat_parameters(params) == mirrored == {"lr": 0.01, "model": "svm", "model/svm/C": 2.5,
                                                   "model/svm/kernel": "rbf"}


def test_plain_dicts_are_walked_and_values_keep_their_type_until_shown_as_text():
    flat = flat_parameters({"opt": {"beta": [0.9, 0.99], "name": "adam"}, "bad key!": True})
    assert flat == {"opt/beta": [0.9, 0.99], "opt/name": "adam", "bad key_": True}  # MLflow takes spaces
    assert [as_text(v) for v in flat.values()] == ["[0.9, 0.99]", "adam", "true"]


def test_only_finite_numbers_are_results():
    assert numbers(0.5) == {"default": 0.5}
    assert numbers({"acc": 1, "loss": math.nan, "gap": math.inf, "ok": True, "note": "x", "nested": {"a": 1}}) \
        == {"acc": 1.0}
    assert numbers(None) == {} and numbers("0.5") == {}
