"""Local training service: the contract, process-group kill, GPU scheduling with a fake nvidia-smi."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import fake_nvidia_smi, process_state, stop_process, wait_for, write_trial
from trialflow.config import LocalConfig
from trialflow.platforms import PlatformError, TrialSpec, TrialStatus
from trialflow.platforms.gpu import GpuProbe
from trialflow.platforms.local import LocalTrainingService
from trialflow.platforms.meta_watch import MetaWatch
from trialflow.testing.contract import TrainingServiceContract, poll_until_terminal
from trialflow.trial.procs import pid_alive


def _local(tmp_path: Path, kill_grace: float = 0.5, **fields) -> LocalTrainingService:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    config = LocalConfig(trial_command="unused", trial_code_directory=code, **fields)
    service = LocalTrainingService(config, tmp_path / "exp", kill_grace_seconds=kill_grace)
    return service


@pytest.fixture
def service(tmp_path):
    svc = _local(tmp_path)
    svc.prepare()
    svc.code = svc.upload_code(tmp_path / "code")
    yield svc
    svc.close()


@pytest.fixture
def make_spec(tmp_path):
    def make(trial_id, body, parameters, gpu_number=None):
        write_trial(tmp_path / "code", body, f"{trial_id}.py")
        return TrialSpec("exp00001", trial_id, 0, 0, parameters, f"{sys.executable} {trial_id}.py",
                         tmp_path / "code", gpu_number)
    return make


class TestLocalContract(TrainingServiceContract):
    pass


def test_trial_sees_nni_environment_and_runs_in_code_dir(service, make_spec, tmp_path):
    body = """
import json, os, nni
nni.get_next_parameter()
keys = ["NNI_PLATFORM", "NNI_EXP_ID", "NNI_TRIAL_JOB_ID", "NNI_SYS_DIR", "NNI_OUTPUT_DIR", "NNI_TRIAL_SEQ_ID"]
nni.report_final_result({"default": 1, "env": {k: os.environ[k] for k in keys}, "cwd": os.getcwd()})
"""
    handle = service.submit(make_spec("EnvT1", body, {}), service.code)
    _, metrics, _ = poll_until_terminal(service, handle)
    final = metrics[-1].value
    assert final["env"]["NNI_PLATFORM"] == "local" and final["env"]["NNI_TRIAL_JOB_ID"] == "EnvT1"
    assert final["env"]["NNI_SYS_DIR"] == str(tmp_path / "exp" / "trials" / "EnvT1")
    assert final["cwd"] == str(tmp_path / "code")
    assert (tmp_path / "exp" / "trials" / "EnvT1" / "parameter.cfg").is_file()


def test_a_trial_inherits_the_users_environment_but_not_the_controllers_credentials(tmp_path, make_spec,
                                                                                   monkeypatch):
    secrets = {"PGPASSWORD": "pg-pass-123", "PREFECT_API_KEY": "pnu_key", "PREFECT_API_AUTH_STRING": "admin:pw",
               "PREFECT_SERVER_API_AUTH_STRING": "admin:pw"}
    for name, value in {**secrets, "MY_OWN_TOKEN": "kept"}.items():
        monkeypatch.setenv(name, value)
    service = _local(tmp_path)  # its trials' environment is taken when it starts
    service.prepare()
    body = ("import json, os, nni\nnni.get_next_parameter()\n"
            "nni.report_final_result({'default': 1, 'env': dict(os.environ)})\n")
    try:
        _, metrics, _ = poll_until_terminal(service, service.submit(make_spec("EnvS1", body, {}),
                                                                    service.upload_code(tmp_path / "code")))
    finally:
        service.close()
    seen = metrics[-1].value["env"]
    assert seen["MY_OWN_TOKEN"] == "kept" and not set(secrets) & set(seen)


def test_cancel_kills_the_whole_process_group(service, make_spec, tmp_path):
    body = """
import subprocess, sys, time, nni, pathlib
nni.get_next_parameter()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
pathlib.Path("child.pid").write_text(str(child.pid))
time.sleep(120)
"""
    handle = service.submit(make_spec("Kill1", body, {}), service.code)
    pid_file = tmp_path / "code" / "child.pid"
    # written by write_text (created, then filled): an empty file is one being written
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=20))
    assert pid_alive(child)
    service.cancel(handle, TrialStatus.USER_CANCELED)
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child), "a grandchild of the trial survived the cancel"


@pytest.mark.parametrize("removed", ["", ".nni"], ids=["all-of-it", "its-meta-folder-first"])
def test_a_trial_directory_removed_while_it_is_polled_is_a_lost_trial_not_a_kill(service, make_spec, monkeypatch,
                                                                                 removed):
    """The trial removes its own directory between two reads of one poll (its keeper's pid file goes
    with it): the trial is lost (recorded FAILED), not "killed" or "never started" (SYS_CANCELED), and
    what still ran of it is stopped. ``rmtree`` empties a folder before removing it, so a poll may also
    find the metadata folder gone while the trial's directory still stands."""
    import shutil

    import trialflow.platforms.local as local
    from trialflow.platforms.base import LostHandleError
    from trialflow.trial.procs import group_alive, kill_group, read_json

    handle = service.submit(make_spec("Gone1", "import time\ntime.sleep(60)\n", {}), service.code)
    deadline = time.monotonic() + 20
    while service.poll(handle, {}).status != TrialStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    keeper = read_json(os.path.join(handle.data["trial_dir"], ".nni", "keeper.pid"))["pid"]
    read = local.read_trial

    def read_then_remove(*args, **kwargs):
        found = read(*args, **kwargs)
        shutil.rmtree(os.path.join(handle.data["trial_dir"], removed))
        return found

    monkeypatch.setattr(local, "read_trial", read_then_remove)
    try:
        with pytest.raises(LostHandleError, match="no longer exists; its processes were stopped"):
            service.poll(handle, {})
        assert not group_alive(keeper), "the lost trial's processes run on, followed by no one"
    finally:
        kill_group(keeper, 0.5)


def test_a_trial_that_ends_while_it_is_polled_keeps_its_success(service, make_spec, monkeypatch):
    """The keeper writes the trial's exit code, then exits. A poll whose listing of the trial's files
    showed no exit code and that then finds the keeper gone must not take the trial for killed: the
    code may have come just after the listing (a busy machine descheduling the poll between the two).
    Here the trial ends, and its keeper with it, inside the poll's listing, which returns what it saw
    before."""
    import trialflow.platforms.local as local
    from trialflow.trial.procs import pid_alive, read_json

    body = ("import os, time, nni\nnni.get_next_parameter()\n"  # waits for 'go' (a minute at most: a failed test's)
            "for _ in range(3000):\n    if os.path.exists('go'):\n        break\n    time.sleep(0.02)\n"
            "nni.report_final_result(0.5)\n")
    handle = service.submit(make_spec("Ends1", body, {}), service.code)
    wait_for(lambda: service.poll(handle, {}).status == TrialStatus.RUNNING, timeout=30)
    keeper = read_json(os.path.join(handle.data["trial_dir"], ".nni", "keeper.pid"))
    seen = []
    real_read_trial = local.read_trial

    def list_then_end(*args, **kwargs):
        found = real_read_trial(*args, **kwargs)
        if not seen:
            seen.append(found.state)  # none yet: the trial runs
            (Path(service.code.location) / "go").touch()
            wait_for(lambda: not pid_alive(keeper["pid"], keeper.get("start_time")), timeout=30, interval=0.02)
        return found

    monkeypatch.setattr(local, "read_trial", list_then_end)
    statuses, metrics, last = poll_until_terminal(service, handle, timeout=30)
    assert seen == [None]
    assert statuses[-1] == TrialStatus.SUCCEEDED, last.message
    assert [m.value for m in metrics] == [0.5]


def test_sigint_trapping_trial_is_escalated_to_sigkill(service, make_spec):
    body = """
import signal, time, nni
nni.get_next_parameter()
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(120)
"""
    handle = service.submit(make_spec("Trap1", body, {}), service.code)
    while service.poll(handle, {}).status != TrialStatus.RUNNING:
        time.sleep(0.05)
    started = time.monotonic()
    service.cancel(handle, TrialStatus.USER_CANCELED)
    assert time.monotonic() - started < 5
    status = poll_until_terminal(service, handle, timeout=10)[0][-1]
    assert status in (TrialStatus.SYS_CANCELED, TrialStatus.FAILED)


def test_a_trial_that_answers_the_cancel_before_its_keeper_runs_again_is_cancelled_not_failed(tmp_path, make_spec):
    """On a loaded machine the trial may answer the cancel's SIGINT with a code of its own (it saves its
    work and exits 1; a trial still starting exits 1 with a KeyboardInterrupt too) before its keeper gets
    the processor to note the signal. The end is the cancel's, not a failure of the trial: the keeper
    is held stopped across the trial's answer here."""
    import json
    import signal
    import threading

    body = ("import pathlib, signal, sys, time, nni\nnni.get_next_parameter()\n"
            "signal.signal(signal.SIGINT, lambda *_: sys.exit(1))\n"
            "pathlib.Path('ready').touch()\ntime.sleep(60)\n")
    service = _local(tmp_path, kill_grace=20.0)  # no SIGTERM before the keeper is let go
    service.prepare()
    try:
        handle = service.submit(make_spec("Answers1", body, {}), service.upload_code(tmp_path / "code"))
        wait_for(lambda: (tmp_path / "code" / "ready").exists(), timeout=30)
        meta = Path(handle.data["trial_dir"]) / ".nni"
        keeper = json.loads((meta / "keeper.pid").read_text())["pid"]
        trial = json.loads((meta / "started").read_text())["pid"]
        stop_process(keeper)
        try:
            cancel = threading.Thread(target=service.cancel, args=(handle, TrialStatus.USER_CANCELED), daemon=True)
            cancel.start()
            wait_for(lambda: process_state(trial) == "Z", timeout=30, interval=0.02)  # it answered, unseen
        finally:
            os.kill(keeper, signal.SIGCONT)
        cancel.join(timeout=30)
        statuses, _, last = poll_until_terminal(service, handle, timeout=30)
    finally:
        service.close()
    assert (statuses[-1], last.exit_code) == (TrialStatus.SYS_CANCELED, None), last.message
    assert last.message == "exit code 1 after a stop signal"


# ---- GPU scheduling ---------------------------------------------------------------------------


@pytest.fixture
def gpus_on_path(tmp_path, monkeypatch):
    def install(count, busy_uuid=None):
        bin_dir = fake_nvidia_smi(tmp_path / f"bin{count}", count, busy_uuid)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        return bin_dir
    return install


GPU_TRIAL = """
import os, time, nni
nni.get_next_parameter()
nni.report_intermediate_result({"default": 0, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")})
time.sleep(1.0)
nni.report_final_result(0)
"""


def _run_gpu_trials(tmp_path, make_spec, count, **fields):
    svc = _local(tmp_path, trial_gpu_number=1, use_active_gpu=False, **fields)
    svc.prepare()
    code = svc.upload_code(tmp_path / "code")
    handles = [svc.submit(make_spec(f"Gpu{i}x", GPU_TRIAL, {}, gpu_number=1), code) for i in range(count)]
    time.sleep(0.5)
    first = [svc.poll(h, {}) for h in handles]
    results = [poll_until_terminal(svc, h) for h in handles]
    return first, results


def test_two_gpus_one_per_trial(tmp_path, make_spec, gpus_on_path):
    bin_dir = gpus_on_path(2)
    first, results = _run_gpu_trials(tmp_path, make_spec, 3)
    assert [u.status for u in first].count(TrialStatus.WAITING) == 1  # third waits for a free GPU
    gpus = [r[1][0].value["gpus"] for r in results]
    assert sorted(gpus[:2]) == ["0", "1"] and gpus[2] in ("0", "1")
    assert all(r[0][-1] == TrialStatus.SUCCEEDED for r in results)
    calls = (bin_dir / "calls").read_text().count("x")
    assert calls <= 6, f"GPU probing is not cached: nvidia-smi ran {calls} times"


def test_fractional_packing_with_max_trials_per_gpu(tmp_path, make_spec, gpus_on_path):
    gpus_on_path(1)
    first, results = _run_gpu_trials(tmp_path, make_spec, 3, max_trial_number_per_gpu=2)
    assert [u.status for u in first].count(TrialStatus.WAITING) == 1
    assert [r[1][0].value["gpus"] for r in results] == ["0", "0", "0"]


def test_asking_for_all_gpus_of_the_machine_schedules(tmp_path, make_spec, gpus_on_path):
    gpus_on_path(1)
    _, results = _run_gpu_trials(tmp_path, make_spec, 1)
    assert results[0][0][-1] == TrialStatus.SUCCEEDED and results[0][1][0].value["gpus"] == "0"


def test_busy_gpu_is_skipped_without_use_active_gpu(tmp_path, make_spec, gpus_on_path):
    gpus_on_path(2, busy_uuid="GPU-0")
    _, results = _run_gpu_trials(tmp_path, make_spec, 2)
    assert [r[1][0].value["gpus"] for r in results] == ["1", "1"]


def test_a_lost_trial_is_stopped_and_its_gpu_goes_to_the_trial_waiting_for_it(tmp_path, make_spec, gpus_on_path):
    """A trial whose directory is removed while it holds the machine's one GPU: the poll that finds it
    lost stops it and releases the GPU, so the trial waiting for a GPU starts on it."""
    import json
    import shutil

    from trialflow.platforms.base import LostHandleError
    from trialflow.trial.procs import group_alive

    gpus_on_path(1)
    svc = _local(tmp_path, trial_gpu_number=1, use_active_gpu=False)
    svc.prepare()
    code = svc.upload_code(tmp_path / "code")
    try:
        lost = svc.submit(make_spec("Lost1x", "import time, nni\nnni.get_next_parameter()\ntime.sleep(60)\n", {},
                                    gpu_number=1), code)
        wait_for(lambda: svc.poll(lost, {}).status == TrialStatus.RUNNING, timeout=30)
        waiting = svc.submit(make_spec("Next1x", GPU_TRIAL, {}, gpu_number=1), code)
        assert svc.poll(waiting, {}).status == TrialStatus.WAITING
        keeper = json.loads((Path(lost.data["trial_dir"]) / ".nni" / "keeper.pid").read_text())["pid"]
        shutil.rmtree(lost.data["trial_dir"])
        with pytest.raises(LostHandleError, match="its processes were stopped"):
            svc.poll(lost, {})
        assert not group_alive(keeper)
        statuses, metrics, _ = poll_until_terminal(svc, waiting)
    finally:
        svc.close()
    assert statuses[-1] == TrialStatus.SUCCEEDED and metrics[0].value["gpus"] == "0"


def test_no_gpu_and_gpus_requested_is_a_clear_error_at_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    svc = _local(tmp_path, trial_gpu_number=1, use_active_gpu=False)
    with pytest.raises(PlatformError, match="nvidia-smi was not found"):
        svc.prepare()


def test_more_gpus_than_the_machine_has_is_refused(tmp_path, gpus_on_path):
    gpus_on_path(1)
    code = tmp_path / "code"
    code.mkdir()
    config = LocalConfig(trial_command="x", trial_code_directory=code, trial_gpu_number=2, use_active_gpu=True)
    with pytest.raises(PlatformError, match="exceeds the 1 usable GPU"):
        LocalTrainingService(config, tmp_path / "exp").prepare()


def test_probe_cache_serves_repeated_queries(tmp_path, gpus_on_path):
    bin_dir = gpus_on_path(2)
    probe = GpuProbe(cache_seconds=60)
    for _ in range(50):
        assert len(probe.gpus()) == 2
    assert (bin_dir / "calls").read_text().count("x") == 2


def test_a_wait_watches_descriptors_numbered_past_selects_limit(service, make_spec):
    """A controller following hundreds of trials holds descriptors numbered past 1024, where select()
    refuses them: a wait there still sleeps its time, and still wakes when its wake-up is set."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    read_end, write_end = os.pipe()
    high = os.dup2(read_end, 1500)
    handle = service.submit(make_spec("Fd1", "import time, nni\nnni.get_next_parameter()\ntime.sleep(60)\n", {}),
                            service.code)
    try:
        wait_for(lambda: service.poll(handle, {}).status == TrialStatus.RUNNING, timeout=30)
        service.wait_or_woken(handle, 0.5, high)  # the first wait begins watching its .nni folder: at once
        started = time.monotonic()
        service.wait_or_woken(handle, 0.5, high)
        assert 0.4 < time.monotonic() - started < 5
        os.write(write_end, b"x")
        started = time.monotonic()
        service.wait_or_woken(handle, 30, high)
        assert time.monotonic() - started < 5
    finally:
        service.cancel(handle, TrialStatus.USER_CANCELED)
        for fd in (high, read_end, write_end):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


REPORTS_LATER = """
import os, time, nni
nni.get_next_parameter()
go = os.path.join(os.environ["NNI_SYS_DIR"], "..", "..", "go-{name}")
deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.05)
{report}
time.sleep(60)
"""


def _quiet_follower_waits(service, handle, wakeup_fd, timeout):
    """Poll and wait as a quiet trial's follower does until a result comes: (polls, seconds to the result)."""
    polls, cursor = 0, {}
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        update = service.poll(handle, cursor)
        polls += 1
        cursor = update.cursor
        if update.metrics:
            return polls, time.monotonic() - began, update
        service.wait_or_woken(handle, 30.0, wakeup_fd)
    raise AssertionError(f"no result in {timeout} s ({polls} polls)")


def test_a_quiet_trials_result_wakes_its_follower_at_once_and_a_stream_of_them_at_most_five_times_a_second(
        service, make_spec, tmp_path):
    """A follower whose quiet trial it waits 30 s for is woken by a result the trial writes (its .nni
    folder is watched), not at the end of its wait; a trial that reports hundreds of results a second
    wakes it at most every 0.2 s, as a trial that reports was read before."""
    read_end, write_end = os.pipe()
    report_one = REPORTS_LATER.format(name="Late1", report="nni.report_intermediate_result(1)")
    one = service.submit(make_spec("Late1", report_one, {}), service.code)
    many = service.submit(make_spec("Many1", REPORTS_LATER.format(
        name="Many1", report="for i in range(600):\n    nni.report_intermediate_result(i)\n    time.sleep(0.005)"),
        {}), service.code)
    try:
        for handle in (one, many):
            wait_for(lambda h=handle: service.poll(h, {}).status == TrialStatus.RUNNING, timeout=30)
            service.wait_or_woken(handle, 30.0, read_end)  # begins watching: returns at once
        threading.Timer(1.5, (tmp_path / "exp" / "go-Late1").touch).start()
        polls, seconds, update = _quiet_follower_waits(service, one, read_end, timeout=20)
        assert 1.4 < seconds < 5 and polls == 2, (polls, seconds)  # the poll before, the one it woke
        assert [m.value for m in update.metrics] == [1]

        (tmp_path / "exp" / "go-Many1").touch()
        polls, cursor, seen = 0, {}, 0
        began = time.monotonic()
        while time.monotonic() - began < 30:
            update = service.poll(many, cursor)
            polls, cursor, seen = polls + 1, update.cursor, seen + len(update.metrics)
            if seen >= 600:
                break
            service.wait_or_woken(many, 30.0, read_end)
        took = time.monotonic() - began
        assert seen == 600, seen
        assert polls <= took / 0.2 + 3, (polls, took)  # 600 results in ~3-6 s: not a poll per result
    finally:
        for handle in (one, many):
            service.cancel(handle, TrialStatus.USER_CANCELED)
        os.close(read_end)
        os.close(write_end)


def test_where_a_trials_folder_cannot_be_watched_a_quiet_follower_still_reads_it_every_second(
        service, make_spec, tmp_path, monkeypatch):
    """Without inotify (another system, or the user's watches used up) a quiet wait lasts a second at
    most, so a result is still seen within one."""
    monkeypatch.setattr(MetaWatch, "watch", lambda self, folder: None)
    read_end, write_end = os.pipe()
    report_one = REPORTS_LATER.format(name="Unw1", report="nni.report_intermediate_result(2)")
    handle = service.submit(make_spec("Unw1", report_one, {}), service.code)
    try:
        wait_for(lambda: service.poll(handle, {}).status == TrialStatus.RUNNING, timeout=30)
        started = time.monotonic()
        service.wait_or_woken(handle, 30.0, read_end)
        assert 0.8 < time.monotonic() - started < 5
        threading.Timer(1.0, (tmp_path / "exp" / "go-Unw1").touch).start()
        polls, seconds, update = _quiet_follower_waits(service, handle, read_end, timeout=20)
        assert [m.value for m in update.metrics] == [2] and polls >= 2, (polls, seconds)
    finally:
        service.cancel(handle, TrialStatus.USER_CANCELED)
        os.close(read_end)
        os.close(write_end)
