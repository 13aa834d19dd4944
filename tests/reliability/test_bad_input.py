"""Bad input, fuzzed with hypothesis: the config loader, the search-space validator and the metric
record parsers (file frames, stdout lines, HTTP bodies). Every input either loads or is refused with
our own error and a message -- never a traceback from deeper code, never a hang (hypothesis deadlines).
Then the odd cases a user hits: unicode and spaces in paths and commands, empty search spaces, zero and
negative limits, very long commands, NaN/inf/strings/deep values, a trial printing megabytes."""

from __future__ import annotations

import json
import string

import pytest
import requests
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import PYTHON, base_config, write_trial
from trialflow import ConfigError, parse_config, run_experiment
from trialflow.config import AlgorithmConfig
from trialflow.platforms.metrics_receiver import MetricsReceiver
from trialflow.records.search_space import SearchSpaceError, parse_search_space
from trialflow.records.store_engine import dumps as store_dumps
from trialflow.trial.records import (
    MetricRecord,
    MetricRecordError,
    encode_file_record,
    encode_stdout_line,
    parse_file_frames,
    parse_record,
    parse_stdout_lines,
)
from trialflow.tuners import InvalidMetric, create_tuner, extract_scalar

FUZZ = settings(max_examples=150, deadline=2000, derandomize=True,  # seeded: CI sees the same cases every run
                suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=12) | st.sampled_from(["", " ", "ü 名前", "1h", "-5m", "0", "x" * 300, "../..", "~"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)

FIELDS = ["experimentName", "searchSpace", "searchSpaceFile", "trialCommand", "trialCodeDirectory",
          "trialConcurrency", "maxTrialNumber", "maxExperimentDuration", "maxTrialDuration", "trialGpuNumber",
          "tuner", "assessor", "advisor", "trainingService", "experimentWorkingDirectory", "nniManagerIp",
          "debug", "logLevel", "useAnnotation", "experimentType", "trialcommand", "authorName",
          "trainingServicePlatform"]
SERVICE_FIELDS = ["platform", "machineList", "reuseMode", "gpuIndices", "useActiveGpu", "maxTrialNumberPerGpu",
                  "storage", "worker", "ps", "master", "namespace", "taskRoles", "knownHostsFile", "metricChannel",
                  "trialGpuNumber", "host", "token", "credentials"]
PLATFORMS = ["local", "remote", "kubeflow", "frameworkcontroller", "adl", "openpai", "aml", "dlc", "LOCAL", "nope", ""]


def _check_config(data) -> None:  # type: ignore[no-untyped-def]
    try:
        parse_config(data, base_dir="/nonexistent-base")
    except ConfigError as exc:
        assert str(exc).strip(), "a ConfigError without a message"


@FUZZ
@given(updates=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values, max_size=5),
       drop=st.lists(st.sampled_from(FIELDS), max_size=3))
def test_fuzzed_top_level_fields_load_or_raise_a_config_error(updates, drop):
    data = base_config("/nonexistent-code", "/nonexistent-work")
    data.update(updates)
    for key in drop:
        data.pop(key, None)
    _check_config(data)


@FUZZ
@given(platform=st.sampled_from(PLATFORMS) | json_values,
       fields=st.dictionaries(st.sampled_from(SERVICE_FIELDS), json_values, max_size=5),
       as_list=st.booleans())
def test_fuzzed_training_services_load_or_raise_a_config_error(platform, fields, as_list):
    service = {"platform": platform, **fields}
    _check_config(base_config("/nonexistent-code", "/nonexistent-work",
                              trainingService=[service] if as_list else service))


@FUZZ
@given(document=st.text(max_size=400) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_fuzzed_yaml_files_load_or_raise_a_config_error(tmp_path_factory, document):
    from trialflow import load_config

    path = tmp_path_factory.mktemp("cfg") / "config.yml"
    path.write_text(document, encoding="utf-8")
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc).strip()


TYPES = ["choice", "randint", "uniform", "quniform", "loguniform", "qloguniform", "normal", "qnormal",
         "lognormal", "qlognormal", "Choice", "bogus"]
spaces = st.recursive(
    st.dictionaries(st.text(max_size=6), st.fixed_dictionaries(
        {"_type": st.sampled_from(TYPES), "_value": st.lists(scalars, max_size=4) | json_values}), max_size=3),
    lambda inner: st.dictionaries(st.text(max_size=6), st.fixed_dictionaries(
        {"_type": st.just("choice"), "_value": st.lists(inner | scalars, max_size=3)}), max_size=2),
    max_leaves=6)


@FUZZ
@given(raw=spaces | json_values)
def test_fuzzed_search_spaces_validate_or_raise_and_valid_ones_sample(raw):
    try:
        space = parse_search_space(raw)
    except SearchSpaceError as exc:
        assert str(exc).strip()
        return
    tuner = create_tuner(AlgorithmConfig(name="Random", class_args={"seed": 0}), space)
    for _ in range(3):
        suggestion = tuner.suggest()
        json.dumps(suggestion.parameters)  # what trials receive must be JSON


# ---- metric records ---------------------------------------------------------------------------------

values = st.recursive(st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.text(max_size=8)
                      | st.none() | st.booleans(),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                  max_size=3), max_leaves=10)
records = st.fixed_dictionaries({
    "parameter_id": st.integers(-1, 5) | json_values, "trial_job_id": st.sampled_from(["abcde", "other"]) | scalars,
    "type": st.sampled_from(["PERIODICAL", "FINAL", "REQUEST_PARAMETER", ""]) | scalars,
    "sequence": st.integers(-2, 10) | scalars,
    "value": values.map(lambda v: json.dumps(v)) | json_values, "version": st.just(1) | scalars})


def _deep(depth: int):  # type: ignore[no-untyped-def]
    value: object = 1.0
    for _ in range(depth):
        value = {"default": value}
    return value


@FUZZ
@given(text=st.text(max_size=300) | records.map(lambda r: json.dumps(r)) | st.binary(max_size=300))
def test_fuzzed_records_parse_or_raise_a_metric_error(text):
    try:
        record = parse_record(text, "abcde")
    except MetricRecordError as exc:
        assert str(exc).strip()
        return
    assert record.trial_id == "abcde" and record.type in ("PERIODICAL", "FINAL")
    _strict_json(store_dumps(record.value))  # what the store keeps is strict JSON


def _strict_json(text: str) -> object:
    def refuse(token: str) -> object:
        raise AssertionError(f"{token} in stored JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), "a string", _deep(30), _deep(200),
                                   {"default": "x"}, [1, 2], {"default": float("nan")}])
def test_odd_metric_values_are_kept_or_refused_and_never_feed_the_tuner(value):
    """NaN, inf, strings and structures without a numeric default are kept for the user to see (as
    strict JSON in the store) but never reach the tuner as a number; values nested too deep are refused."""
    line = json.dumps({"parameter_id": 0, "trial_job_id": "abcde", "type": "FINAL", "sequence": 0,
                       "value": json.dumps(value), "version": 1})
    try:
        record = parse_record(line, "abcde")
    except MetricRecordError as exc:
        assert "deep" in str(exc)
        return
    _strict_json(store_dumps(record.value))
    with pytest.raises(InvalidMetric):
        extract_scalar(record.value)


good = st.builds(lambda seq, v: MetricRecord("abcde", "PERIODICAL", seq, v), st.integers(0, 1000),
                 st.floats(allow_nan=False, allow_infinity=False))


@FUZZ
@given(chunks=st.lists(good.map(encode_file_record) | st.binary(max_size=40), max_size=12), cut=st.integers(0, 2000))
def test_fuzzed_metrics_files_never_break_the_reader(chunks, cut):
    data = b"".join(chunks)
    result = parse_file_frames(data[:cut], 100, "abcde")
    assert 100 <= result.offset <= 100 + min(cut, len(data))
    rest = parse_file_frames(data[result.offset - 100:], 0, "abcde")  # continuing from the cursor
    assert rest.offset <= len(data)


@FUZZ
@given(frames=st.lists(good, max_size=10))
def test_clean_metrics_files_lose_nothing(frames):
    result = parse_file_frames(b"".join(encode_file_record(r) for r in frames), 0, "abcde")
    assert result.records == frames and result.errors == []


@FUZZ
@given(lines=st.lists(good.map(lambda r: encode_stdout_line(r).encode()) | st.binary(max_size=60)
                      | st.text(max_size=60).map(lambda t: ("NNISDK_MEb'" + t).encode()), max_size=12))
def test_fuzzed_stdout_never_breaks_the_reader(lines):
    data = b"\n".join(lines) + b"\n"
    result = parse_stdout_lines(data, 0, "abcde")
    assert result.offset == len(data)
    expected = [ln for ln in lines if ln.startswith(b"NNISDK_MEb'{") and ln.endswith(b"}'") and b"\n" not in ln]
    assert len(result.records) <= len(expected)


def test_megabytes_of_output_without_newline_are_skipped_as_oversized():
    huge = b"x" * 3_000_000
    waiting = parse_stdout_lines(huge[:500_000], 0, "abcde")
    assert waiting.offset == 0 and not waiting.errors  # an unfinished line waits for more
    skipped = parse_stdout_lines(huge, 0, "abcde")
    assert skipped.offset == len(huge) and "over" in skipped.errors[0]
    line = encode_stdout_line(MetricRecord("abcde", "FINAL", 0, 1.5)).encode() + b"\n"
    assert parse_stdout_lines(huge + b"\n" + line, 0, "abcde").records[0].value == 1.5


@pytest.fixture(scope="module")
def receiver():
    r = MetricsReceiver(max_body=64 * 1024).start()
    r.grant("fuzz-token-" * 4, "abcde")
    yield r
    r.stop()


@settings(max_examples=120, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=300) | st.lists(records.map(json.dumps), max_size=3).map(
    lambda rs: json.dumps({"metrics": rs}).encode()) | json_values.map(lambda v: json.dumps(v).encode()),
    path=st.sampled_from(["abcde", "other", "", "abcde/../x", "%00", "a" * 300]))
def test_fuzzed_http_bodies_get_a_4xx_or_200_never_a_crash(receiver, body, path):
    answer = requests.post(f"{receiver.url}/metrics/{path}", data=body, timeout=10,
                           headers={"Authorization": "Bearer " + "fuzz-token-" * 4})
    assert answer.status_code in (200, 400, 401, 403, 404, 413, 422, 429), answer.status_code
    if answer.status_code != 200:
        assert answer.json()["error"]
    receiver.drain("abcde")


def test_the_receiver_still_answers_after_the_fuzzing(receiver):
    # a trial no fuzzed request named: the fuzzing may have sent abcde's FINAL 0 already (a duplicate then)
    receiver.grant("fuzz-token-" * 4, "after")
    line = MetricRecord("after", "FINAL", 0, 2.5).to_json()
    answer = requests.post(f"{receiver.url}/metrics/after", json={"metrics": [line]}, timeout=10,
                           headers={"Authorization": "Bearer " + "fuzz-token-" * 4})
    assert answer.status_code == 200 and [r.value for r in receiver.drain("after")] == [2.5]


# ---- the odd cases, end to end ---------------------------------------------------------------------

@pytest.mark.parametrize("field, value, expected", [
    ("trialConcurrency", 0, "trialConcurrency"), ("trialConcurrency", -3, "trialConcurrency"),
    ("maxTrialNumber", 0, "maxTrialNumber"), ("maxTrialNumber", -1, "maxTrialNumber"),
    ("maxExperimentDuration", "0s", "maxExperimentDuration"), ("maxExperimentDuration", "-5m", "maxExperimentDuration"),
    ("maxTrialDuration", -1, "maxTrialDuration"), ("trialGpuNumber", -1, "trialGpuNumber"),
    ("searchSpace", {}, "searchSpace"), ("trialCommand", "", "trialCommand"),
])
def test_zero_negative_and_empty_values_name_the_field(tmp_path, field, value, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(base_config(tmp_path, tmp_path / "w", **{field: value}))
    assert expected in str(err.value)


TRIAL = """
import sys, nni
p = nni.get_next_parameter()
print("x" * 1024 * 1024 * 4)          # megabytes on stdout, one line
for _ in range(2000):
    print("log line " * 20)
nni.report_intermediate_result(float("nan"))   # refused, the trial goes on
nni.report_final_result({"default": p["ñame"], "args": sys.argv[1:]})
"""


def test_unicode_spaces_long_commands_and_megabytes_of_output(tmp_path, prefect_server):
    code = tmp_path / "código del ensayo ü"
    write_trial(code, TRIAL, name="mi ensayo.py")
    long_arg = "ü-" + "y" * 60_000
    command = f"{PYTHON} 'mi ensayo.py' 'a b' \"$(printf 'ñ')\" {long_arg}"
    config = base_config(code, tmp_path / "trabajo ü", trialCommand=command, maxTrialNumber=2,
                         searchSpace={"ñame": {"_type": "uniform", "_value": [0, 1]}})
    result = run_experiment(config)
    assert result.status == "DONE"
    assert [(t.status, t.message) for t in result.trials if t.status != "SUCCEEDED"] == []
    for trial in result.trials:
        assert trial.final["args"] == ["a b", "ñ", long_arg]
        assert trial.final["default"] == trial.parameters["ñame"]


@pytest.mark.parametrize("template", ["'; touch {m}; '", "$(touch {m})", "`touch {m}`", "\" && touch {m} #"])
def test_parameters_with_shell_syntax_never_reach_a_shell(tmp_path, prefect_server, template):
    """Choice values full of shell syntax reach the trial as data, not as code."""
    marker = tmp_path / "touched"
    write_trial(tmp_path / "code", "import nni\n"
                "nni.report_final_result({'default': 1, 'v': nni.get_next_parameter()['v']})\n")
    value = template.format(m=marker)
    config = base_config(tmp_path / "code", tmp_path / "w", maxTrialNumber=1,
                         searchSpace={"v": {"_type": "choice", "_value": [value]}})
    result = run_experiment(config)
    assert result.trials[0].final["v"] == value and not marker.exists()


@given(name=st.text(alphabet=string.printable + "üñ名 ", min_size=1, max_size=30))
@settings(max_examples=40, deadline=2000)
def test_any_experiment_name_loads_or_is_refused_clearly(name):
    assume(name.strip())
    _check_config(base_config("/nonexistent-code", "/nonexistent-work", experimentName=name))
