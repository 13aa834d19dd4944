"""The in-memory training service (``trialflow.testing.memory``) is held to the contract every
platform meets, so the flow-logic tests that run on it test what a real platform would show."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import write_trial
from trialflow.platforms import PlatformError, TrialSpec, TrialStatus
from trialflow.testing.contract import SCRIPT_PER_TRIAL, TrainingServiceContract, poll_until_terminal, spec_maker
from trialflow.testing.memory import MemoryConfig, MemoryTrainingService


@pytest.fixture
def service(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    svc = MemoryTrainingService(MemoryConfig(trial_command=SCRIPT_PER_TRIAL, trial_code_directory=code),
                                tmp_path / "exp")
    svc.prepare()
    svc.code = svc.upload_code(code)
    yield svc
    svc.close()


@pytest.fixture
def make_spec(service):
    return spec_maker(service, Path(service.config.trial_code_directory))


class TestMemoryContract(TrainingServiceContract):
    pass


def test_an_hour_of_trial_sleep_passes_in_well_under_a_second_of_real_time(service, make_spec):
    body = "import nni, time\nnni.get_next_parameter()\nfor i in range(60):\n" \
           "    time.sleep(60)\n    nni.report_intermediate_result(i)\nnni.report_final_result(time.monotonic())\n"
    started = time.monotonic()
    handle = service.submit(make_spec("Hour1", body, {}), service.code)
    statuses, metrics, _ = poll_until_terminal(service, handle)
    assert time.monotonic() - started < 5
    assert statuses[-1] == TrialStatus.SUCCEEDED
    assert [m.value for m in metrics if m.type == "PERIODICAL"] == list(range(60))
    assert [m.value for m in metrics if m.type == "FINAL"][0] >= 3600  # the trial's own clock says an hour


def test_a_cancelled_trial_ends_at_its_next_sleep_as_a_sigint_would(service, make_spec):
    handle = service.submit(make_spec("Kill1", "import time\nwhile True:\n    time.sleep(1)\n", {}), service.code)
    service.wait(handle, 0.5)
    service.cancel(handle, TrialStatus.USER_CANCELED)
    update = service.poll(handle, {})
    assert update.status == TrialStatus.FAILED and update.exit_code == 130  # the flow records its own reason
    assert "KeyboardInterrupt" in service.logs(handle)["trial.stderr"]


def test_a_command_that_is_not_a_python_script_is_one_clear_error(service, tmp_path):
    write_trial(tmp_path / "code", "print(1)\n", "t.py")
    spec = TrialSpec("exp1", "Cmd1", 0, 0, {}, "bash run.sh", tmp_path / "code")
    with pytest.raises(PlatformError, match="python <script.py>"):
        service.submit(spec, service.code)


def test_a_trial_that_exits_at_once_is_never_taken_for_lost(service, make_spec):
    """Polled while its thread records its end, a trial reads as running or ended with its exit code:
    never as a run that vanished (SYS_CANCELED)."""
    body = "import sys\nsys.exit(3)\n"
    for i in range(60):
        handle = service.submit(make_spec(f"Quick{i}", body, {}), service.code)
        update = service.poll(handle, {})
        while not update.status.is_terminal:
            update = service.poll(handle, {})
        assert (update.status, update.exit_code) == (TrialStatus.FAILED, 3), (i, update)
