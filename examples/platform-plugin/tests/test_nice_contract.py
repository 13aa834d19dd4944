"""trialflow's shipped contract suite, run against the ``nice`` platform: the same tests every
built-in platform passes (lifecycle, metrics, failures, cancel, adopt after a restart, logs)."""

from __future__ import annotations

import sys

import pytest
from trialflow_nice import NiceConfig, NiceTrainingService

from trialflow.platforms import TrialSpec
from trialflow.testing.contract import TrainingServiceContract, poll_until_terminal

NICENESS_TRIAL = """
import nni, os
nni.get_next_parameter()
nni.report_final_result(os.nice(0))
"""


@pytest.fixture
def service(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    svc = NiceTrainingService(NiceConfig(trial_command="unused", trial_code_directory=code, niceness=7),
                              tmp_path / "exp", kill_grace_seconds=0.5)
    svc.prepare()
    svc.code = svc.upload_code(code)
    yield svc
    svc.close()


@pytest.fixture
def make_spec(tmp_path):
    def make(trial_id, body, parameters, gpu_number=None):
        (tmp_path / "code" / f"{trial_id}.py").write_text(body)
        return TrialSpec("exp00001", trial_id, 0, 0, parameters, f"{sys.executable} {trial_id}.py",
                         tmp_path / "code", gpu_number)
    return make


class TestNiceContract(TrainingServiceContract):
    pass


def test_trials_run_at_the_configured_niceness(service, make_spec):
    handle = service.submit(make_spec("Nice1", NICENESS_TRIAL, {}), service.code)
    statuses, metrics, _ = poll_until_terminal(service, handle)
    assert statuses[-1] == "SUCCEEDED"
    assert [m.value for m in metrics if m.type == "FINAL"] == [7]
