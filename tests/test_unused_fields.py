"""Fields NNI acts on: each works here, or is refused or warned about with its path -- never
accepted and then quietly ignored."""

from __future__ import annotations

import logging
import warnings

import pytest

from tests.conftest import base_config, k8s_section, write_trial
from trialflow import parse_config, run_experiment
from trialflow.config import ConfigError, ConfigWarning


def _config(tmp_path, **overrides) -> dict:
    write_trial(tmp_path / "code", "import nni\nnni.get_next_parameter()\n")  # reports no final result
    return base_config(tmp_path / "code", tmp_path / "w", **overrides)


def _warnings_of(config: dict) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parse_config(config)
    return [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def test_local_reuse_mode_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError, match=r"trainingService: .*reuseMode: true is not available on local.*remove "
                                          "reuseMode"):
        parse_config(_config(tmp_path, trainingService={"platform": "local", "reuseMode": True}))
    parse_config(_config(tmp_path, trainingService={"platform": "local", "reuseMode": False}))


def test_tuner_gpu_indices_is_warned_about(tmp_path):
    assert any(m.startswith("tunerGpuIndices has no effect") and "CUDA_VISIBLE_DEVICES" in m
               for m in _warnings_of(_config(tmp_path, tunerGpuIndices="0,1")))
    assert _warnings_of(_config(tmp_path)) == []


def test_adaptdl_log_collection_http_is_warned_about(tmp_path):
    section = {**k8s_section("adaptdl", tmp_path / "nfs"), "logCollection": "http"}
    assert any(m.startswith("trainingService.logCollection: http is not needed")
               for m in _warnings_of(_config(tmp_path, trainingService=section)))
    section["logCollection"] = "none"
    assert _warnings_of(_config(tmp_path, trainingService=section)) == []


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize(("fields", "shown"), [({"logLevel": "error"}, False), ({"logLevel": "warning"}, True),
                                                ({"debug": True}, True)])
def test_log_level_sets_what_the_controller_logs(tmp_path, caplog, fields, shown):
    caplog.set_level(logging.DEBUG, logger="trialflow")
    result = run_experiment(_config(tmp_path, maxTrialNumber=1, trialConcurrency=1, **fields))
    assert result.status == "DONE"
    noted = [r for r in caplog.records if "reported no final result" in r.getMessage()]
    assert bool(noted) is shown
    if fields.get("debug"):
        assert logging.getLogger("trialflow").level == logging.DEBUG


def test_hybrid_only_fields_are_warned_about_with_one_service(tmp_path):
    warned = _warnings_of(_config(tmp_path, trainingService={"platform": "local", "maxConcurrency": 2}))
    assert any(m.startswith("trainingService: maxConcurrency and weight only place trials") for m in warned)
    hybrid = [{"platform": "local", "maxConcurrency": 2, "weight": 3}, {"platform": "local"}]
    assert _warnings_of(_config(tmp_path, trainingService=hybrid)) == []


def test_platform_concurrency_in_a_hybrid_experiment_is_refused(tmp_path):
    hybrid = [{"platform": "local"}, {"platform": "local", "platformConcurrency": 2}]
    with pytest.raises(ConfigError, match=r"trainingService\[1\]\.platformConcurrency is not supported in a hybrid"):
        parse_config(_config(tmp_path, trainingService=hybrid))


def test_v1_fields_without_a_counterpart_are_warned_about(tmp_path):
    write_trial(tmp_path / "code", "import nni\n")
    v1 = {"authorName": "nni", "trialConcurrency": 1, "trainingServicePlatform": "local", "multiThread": True,
          "logCollection": "http", "versionCheck": False, "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
          "tuner": {"builtinTunerName": "TPE", "gpuIndices": "0", "includeIntermediateResults": True},
          "trial": {"command": "python3 trial.py", "codeDir": str(tmp_path / "code")}}
    warned = _warnings_of(v1)
    for start in ("multiThread: tuner calls are serialised", "logCollection: trial logs stay",
                  "versionCheck: the trial runtime's version", "tuner.gpuIndices: has no effect",
                  "tuner.includeIntermediateResults: has no effect"):
        assert any(m.startswith(start) for m in warned), (start, warned)


def test_nni_manager_ip_on_remote_is_warned_about(tmp_path):
    remote = {"platform": "remote", "machineList": [{"host": "127.0.0.1", "user": "u", "password": "pw-12345"}]}
    warned = _warnings_of(_config(tmp_path, nniManagerIp="10.1.2.3", trainingService=remote))
    assert any(m.startswith("trainingService.nniManagerIp has no effect on remote machines") for m in warned)
    assert not any("nniManagerIp" in m for m in _warnings_of(_config(tmp_path, trainingService=remote)))
