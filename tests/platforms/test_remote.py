"""Remote service over real SSH (two loopback sshd servers): the contract with and without reuse,
host keys, bad credentials, version check, GPU slots from the remote nvidia-smi, code upload once,
and trials that survive a dropped connection."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import fake_nvidia_smi, machine, wait_for, write_trial
from trialflow.config import ConfigError, RemoteConfig, parse_config
from trialflow.platforms import LostHandleError, PlatformError, TrialSpec, TrialStatus
from trialflow.platforms.remote import RemoteTrainingService
from trialflow.platforms.runtime_files import VersionMismatchError, check_version
from trialflow.platforms.trialdir import EnvironmentDir
from trialflow.platforms.trialfs import LocalFS
from trialflow.testing.contract import (
    SLEEPING_TRIAL,
    InterruptionContract,
    TrainingServiceContract,
    poll_until_terminal,
)
from trialflow.trial.procs import group_alive, kill_group, pid_alive


def remote_service(tmp_path: Path, servers, known_hosts: Path, exp_id: str = "exp00001", **fields
                   ) -> RemoteTrainingService:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    machines = fields.pop("machines", None) or [machine(s, tmp_path / f"remote{i}") for i, s in enumerate(servers)]
    config = RemoteConfig(trial_command="unused", trial_code_directory=code, machine_list=machines,
                          known_hosts_file=known_hosts, **fields)
    return RemoteTrainingService(config, tmp_path / "exp" / exp_id, kill_grace_seconds=0.5)


@pytest.fixture(params=[False, True], ids=["per-trial-ssh", "reuse"])
def service(request, tmp_path, sshd_servers, known_hosts):
    svc = remote_service(tmp_path, sshd_servers[:1], known_hosts, reuse_mode=request.param)
    svc.prepare()
    svc.code = svc.upload_code(tmp_path / "code")
    yield svc
    svc.close()


@pytest.fixture
def make_spec(tmp_path, service):
    def make(trial_id, body, parameters, gpu_number=None):
        write_trial(tmp_path / "code", body, f"{trial_id}.py")
        service.code = service.upload_code(tmp_path / "code")  # the new script travels with the code
        return TrialSpec("exp00001", trial_id, 0, 0, parameters, f"python3 {trial_id}.py", tmp_path / "code",
                         gpu_number)
    return make


class TestRemoteContract(TrainingServiceContract):
    pass


class TestRemoteInterruptions(InterruptionContract):
    """The machine loses the trial's processes, keeper included, as a restart does: nothing is recorded."""

    @pytest.fixture
    def interrupt(self, tmp_path):
        import signal

        from tests.test_prefect_pool_experiment import _processes_of_trial

        def restart(handle):
            keeper = json.loads((Path(handle.data["trial_dir"]) / ".nni" / "keeper.pid").read_text())["pid"]
            lost = {keeper, *_processes_of_trial(handle.trial_id)}
            # all at one moment, as a restart: each is stopped before any dies, so no keeper outlives its trial
            # long enough to record the kill as the trial's exit code (137: CI of f6af7c5)
            for signal_number in (signal.SIGSTOP, signal.SIGKILL):
                for pid in lost:
                    with contextlib.suppress(ProcessLookupError):  # gone already: lost as well
                        os.kill(pid, signal_number)
            return "ended without recording an exit code (the machine restarted"
        return restart


def test_trial_runs_in_the_uploaded_code_with_its_own_directory(service, make_spec, tmp_path):
    body = """
import os, sys, nni
nni.get_next_parameter()
nni.report_final_result({"default": 1, "cwd": os.getcwd(), "sys_dir": os.environ["NNI_SYS_DIR"],
                         "platform": os.environ["NNI_PLATFORM"], "python": sys.executable})
"""
    handle = service.submit(make_spec("Where1", body, {}), service.code)
    _, metrics, _ = poll_until_terminal(service, handle)
    final = metrics[-1].value
    remote = tmp_path / "remote0"
    assert final["cwd"] == str(remote / "code" / service.code.content_hash)
    assert final["sys_dir"] == str(remote / "exp00001" / "trials" / "Where1")
    assert final["platform"] == "remote" and final["python"].startswith(os.path.dirname(sys.executable))
    assert (remote / "exp00001" / "trials" / "Where1" / "parameter.cfg").is_file()
    logs = service.logs(handle)
    assert set(logs) >= {"trial.stdout", "trial.stderr"}
    assert (tmp_path / "exp" / "exp00001" / "trials" / "Where1" / "trial.stdout").is_file()  # fetched copy


def test_parameters_never_reach_a_shell(service, make_spec, tmp_path):
    body = "import nni\nnni.report_final_result({'default': 0, 'p': nni.get_next_parameter()})\n"
    evil = {"cmd": "$(touch /tmp/trialflow-pwned); `id`; ' \" \\", "x": "\n; rm -rf /"}
    handle = service.submit(make_spec("Evil1", body, evil), service.code)
    _, metrics, _ = poll_until_terminal(service, handle)
    assert metrics[-1].value["p"] == evil and not os.path.exists("/tmp/trialflow-pwned")


def test_a_dropped_connection_does_not_fail_running_trials(service, make_spec, sshd_servers):
    body = """
import time, nni
nni.get_next_parameter()
for i in range(6):
    nni.report_intermediate_result(i)
    time.sleep(0.25)
nni.report_final_result(6)
"""
    handle = service.submit(make_spec("Drop1", body, {}), service.code)
    time.sleep(0.4)
    assert sshd_servers[0].drop_connections() > 0
    statuses, metrics, _ = poll_until_terminal(service, handle)
    assert statuses[-1] == TrialStatus.SUCCEEDED
    assert [m.value for m in metrics] == [0, 1, 2, 3, 4, 5, 6]
    assert service.machines[0].conn.reconnects >= 1


def test_cancel_of_a_queued_or_held_trial_prevents_its_start(tmp_path, sshd_servers, known_hosts):
    svc = remote_service(tmp_path, sshd_servers[:1], known_hosts, reuse_mode=True)
    svc.prepare()
    write_trial(tmp_path / "code", SLEEPING_TRIAL, "s.py")
    code = svc.upload_code(tmp_path / "code")
    env_dir = Path(svc._env_dir(svc.machines[0]))  # noqa: SLF001
    (env_dir / "stop").touch()
    time.sleep(0.3)  # the worker leaves; the queued trial is not taken
    handle = svc.submit(TrialSpec("exp00001", "Queue1", 0, 0, {}, "python3 s.py", tmp_path / "code"), code)
    assert svc.poll(handle, {}).status == TrialStatus.WAITING
    svc.cancel(handle, TrialStatus.USER_CANCELED)
    update = svc.poll(handle, {})
    assert update.status == TrialStatus.SYS_CANCELED and "before it started" in update.message
    svc.close()


def test_unknown_host_key_is_refused_by_default_naming_the_fix(tmp_path, sshd_servers):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    svc = remote_service(tmp_path, sshd_servers[:1], empty)
    with pytest.raises(PlatformError) as err:
        svc.prepare()
    port = sshd_servers[0].port
    assert "unknown SSH host key" in str(err.value)
    assert f"ssh-keyscan -p {port} 127.0.0.1 >> {empty}" in str(err.value) and "trustUnknownHosts" in str(err.value)


def test_trust_on_first_use_records_the_key_and_a_changed_key_is_refused(tmp_path, sshd_servers):
    path = tmp_path / "kh" / "known_hosts"
    svc = remote_service(tmp_path, sshd_servers[:1], path, trust_unknown_hosts=True)
    svc.prepare()
    svc.close()
    assert sshd_servers[0].host_public_key.split()[1] in path.read_text()
    other = sshd_servers[1].host_public_key
    path.write_text(f"[127.0.0.1]:{sshd_servers[0].port} {other}\n")  # a different key for that host
    svc = remote_service(tmp_path, sshd_servers[:1], path, trust_unknown_hosts=True)
    with pytest.raises(PlatformError, match="host key differs .* man-in-the-middle"):
        svc.prepare()


def test_wrong_password_is_a_clear_error_at_start(tmp_path, sshd_servers, known_hosts):
    s = sshd_servers[0]
    entry = {**machine(s, tmp_path / "r"), "password": "definitely-wrong-password-7"}
    entry.pop("sshKeyFile")
    svc = remote_service(tmp_path, sshd_servers, known_hosts, machines=[entry])
    with pytest.raises(PlatformError) as err:
        svc.prepare()
    assert "SSH authentication failed with the password" in str(err.value)
    assert "definitely-wrong-password-7" not in str(err.value)


def test_missing_key_file_is_a_config_error(tmp_path, sshd_servers):
    entry = {**machine(sshd_servers[0], tmp_path / "r"), "sshKeyFile": str(tmp_path / "nope")}
    with pytest.raises(ConfigError, match=r'machineList\[0\].*valid SSH key file: sshKeyFile .*nope" is not a file'):
        parse_config({"trialCommand": "x", "trialCodeDirectory": str(tmp_path), "searchSpace": {},
                      "trialConcurrency": 1,
                      "tuner": {"name": "Random"}, "trainingService": {"platform": "remote", "machineList": [entry]}})


def test_unreachable_host_is_a_clear_error_at_start(tmp_path, sshd_servers, known_hosts):
    from trialflow.testing.ports import free_port

    entry = {**machine(sshd_servers[0], tmp_path / "r"), "port": free_port()}
    svc = remote_service(tmp_path, sshd_servers, known_hosts, machines=[entry])
    with pytest.raises(PlatformError, match=r"cannot connect: .*(refused|Unable to connect).* check host, port"):
        svc.prepare()


def test_version_mismatch_is_a_clear_error(tmp_path, sshd_servers, known_hosts, monkeypatch):
    import trialflow.platforms.remote as remote

    with pytest.raises(VersionMismatchError, match=r"runs trialflow 0.9.1 but this controller is trialflow 1.2.0"):
        check_version("0.9.1", "the keeper", "upgrade", "1.2.0")
    check_version("1.2.7", "the keeper", "upgrade", "1.2.0")  # patch releases mix
    monkeypatch.setattr(remote, "__version__", "7.5.0")
    svc = remote_service(tmp_path, sshd_servers[:1], known_hosts)
    expected = r"trial keeper on .* runs trialflow .* controller is trialflow 7.5.0.*remove"
    with pytest.raises(VersionMismatchError, match=expected):
        svc.prepare()


def test_gpu_slots_come_from_the_remote_nvidia_smi(tmp_path, sshd_servers, known_hosts):
    bin_dir = fake_nvidia_smi(tmp_path / "remote-bin", 2)
    os.symlink(sys.executable, bin_dir / "python3")
    machines = [machine(sshd_servers[0], tmp_path / "r0", pythonPath=str(bin_dir))]
    svc = remote_service(tmp_path, sshd_servers, known_hosts, machines=machines, trial_gpu_number=1)
    svc.prepare()
    write_trial(tmp_path / "code", """
import os, time, nni
nni.get_next_parameter()
time.sleep(1.0)
nni.report_final_result({"default": 0, "gpus": os.environ["CUDA_VISIBLE_DEVICES"]})
""", "g.py")
    code = svc.upload_code(tmp_path / "code")
    specs = [TrialSpec("exp00001", f"Gpu{i}", i, i, {}, "python3 g.py", tmp_path / "code", 1) for i in range(3)]
    handles = [svc.submit(s, code) for s in specs]
    time.sleep(0.5)
    first = [svc.poll(h, {}).status for h in handles]
    assert first.count(TrialStatus.WAITING) == 1  # two GPUs, three trials
    gpus = [poll_until_terminal(svc, h)[1][-1].value["gpus"] for h in handles]
    assert sorted(gpus[:2]) == ["0", "1"] and gpus[2] in ("0", "1")
    assert (bin_dir / "calls").read_text().count("x") <= 6  # probing is cached
    svc.close()


def test_unchanged_code_is_uploaded_once_per_machine_across_experiments(tmp_path, sshd_servers, known_hosts):
    write_trial(tmp_path / "code", "print('hello')\n" * 1000, "train.py")
    first = remote_service(tmp_path, sshd_servers, known_hosts, exp_id="expAAAA1")
    first.prepare()
    ref = first.upload_code(tmp_path / "code")
    archive = len(_archive_bytes(tmp_path / "code"))
    assert first.uploaded_bytes == 2 * archive  # two machines, once each
    first.upload_code(tmp_path / "code")
    assert first.uploaded_bytes == 2 * archive
    first.close()
    second = remote_service(tmp_path, sshd_servers, known_hosts, exp_id="expBBBB2")
    second.prepare()
    assert second.upload_code(tmp_path / "code").content_hash == ref.content_hash
    assert second.uploaded_bytes == 0
    second.close()


def _archive_bytes(code: Path) -> bytes:
    from trialflow.records.codebundle import scan_code_dir

    out = bytearray()
    scan_code_dir(code).stream(out.extend)
    return bytes(out)


def test_code_limits_are_reported_before_any_upload(tmp_path, sshd_servers, known_hosts):
    svc = remote_service(tmp_path, sshd_servers[:1], known_hosts)
    svc.prepare()
    with open(tmp_path / "code" / "data.bin", "wb") as f:
        f.truncate(301 * 1024 * 1024)
    with pytest.raises(PlatformError, match="limit is 300.0 MB.*data.bin"):
        svc.upload_code(tmp_path / "code")
    assert svc.uploaded_bytes == 0
    svc.close()


def test_a_retried_submission_stays_on_its_first_machine_and_runs_once(tmp_path, sshd_servers, known_hosts):
    """A submission whose answer was lost is retried; the first attempt may have started the trial, so
    the retry must go to the same machine (another one would run the trial a second time)."""
    svc = remote_service(tmp_path, sshd_servers, known_hosts)
    svc.prepare()
    try:
        write_trial(tmp_path / "code", f"import os\nopen({str(tmp_path / 'runs')!r}, 'a').write('run\\n')\n",
                    "Retry1.py")
        code = svc.upload_code(tmp_path / "code")
        spec = TrialSpec("exp00001", "Retry1", 0, 0, {}, "python3 Retry1.py", tmp_path / "code")
        first = svc.submit(spec, code)
        again = svc.submit(spec, code)  # as submit_with_retries does after a TransientPlatformError
        assert again.data["machine"] == first.data["machine"]
        restarted = remote_service(tmp_path, sshd_servers, known_hosts)  # a resumed controller resubmits
        restarted.prepare()
        assert restarted.submit(spec, code).data["machine"] == first.data["machine"]
        restarted.close()
        statuses, _, _ = poll_until_terminal(svc, first)
        assert statuses[-1] == TrialStatus.SUCCEEDED
        assert (tmp_path / "runs").read_text() == "run\n"
    finally:
        svc.close()


def test_a_login_refused_after_it_worked_is_retried_not_fatal(sshd_servers, known_hosts):
    """A server dropping its sessions can refuse a login in progress; credentials that worked before
    make that a transient error (the trial's follower retries), while a first login refused stays fatal."""
    from trialflow.platforms import TransientPlatformError
    from trialflow.platforms.ssh import SshConnection, SshTarget

    server = sshd_servers[0]
    target = SshTarget("127.0.0.1", server.port, server.user, key_file=server.key_file)
    conn = SshConnection(target, known_hosts)
    authorized = server.directory / "authorized_keys"
    keys = authorized.read_text()
    try:
        assert conn.run("echo hi")[1].strip() == "hi"
        authorized.write_text("")  # now every login is refused
        server.drop_connections()
        with pytest.raises(TransientPlatformError, match="worked before"):
            conn.run("echo again")
        with pytest.raises(PlatformError, match="authentication failed") as first:
            SshConnection(target, known_hosts).run("echo fresh")
        assert not isinstance(first.value, TransientPlatformError)
    finally:
        authorized.write_text(keys)
        conn.close()
    assert SshConnection(target, known_hosts).run("echo back")[1].strip() == "back"


def test_a_connection_dying_while_sftp_opens_is_retried_not_taken_for_a_host_without_sftp(
        sshd_servers, known_hosts, monkeypatch):
    """The sshd-restart race: the server side of a connection is killed while the SFTP subsystem
    opens, before the client's transport has noticed -- it looks like a refused subsystem on a live
    connection once. A fresh connection must be tried before calling the host SFTP-less."""
    import paramiko

    from trialflow.platforms.ssh import SshConnection, SshTarget

    server = sshd_servers[0]
    conn = SshConnection(SshTarget("127.0.0.1", server.port, server.user, key_file=server.key_file), known_hosts)
    real_open, failures = paramiko.SSHClient.open_sftp, []

    def dying_once(client):
        if not failures:
            failures.append(client)
            raise paramiko.SSHException("Channel closed.")  # what paramiko reports for both cases
        return real_open(client)

    monkeypatch.setattr(paramiko.SSHClient, "open_sftp", dying_once)
    try:
        assert conn.sftp_call("listing /", lambda sftp: "tmp" in sftp.listdir("/"))
        assert failures and conn.reconnects == 1  # it went through a new connection
    finally:
        conn.close()


def test_a_host_without_sftp_is_named_with_how_to_enable_it(tmp_path):
    from trialflow.testing.sshd import LoopbackSshd

    with LoopbackSshd(tmp_path / "nosftp", sftp=False) as server:
        svc = remote_service(tmp_path, [server], server.known_hosts)
        with pytest.raises(PlatformError) as err:
            svc.prepare()
        svc.close()
    message = str(err.value)
    assert "SFTP is not available on this host" in message and "Subsystem sftp" in message
    assert "connection lost" not in message


def test_gpu_trials_go_where_gpu_slots_are_free(tmp_path, sshd_servers, known_hosts):
    small, big = fake_nvidia_smi(tmp_path / "bin-small", 1), fake_nvidia_smi(tmp_path / "bin-big", 4)
    for bin_dir in (small, big):
        os.symlink(sys.executable, bin_dir / "python3")
    machines = [machine(sshd_servers[0], tmp_path / "r0", pythonPath=str(small)),
                machine(sshd_servers[1], tmp_path / "r1", pythonPath=str(big))]
    svc = remote_service(tmp_path, sshd_servers, known_hosts, machines=machines, trial_gpu_number=1)
    svc.prepare()
    write_trial(tmp_path / "code", SLEEPING_TRIAL, "s.py")
    code = svc.upload_code(tmp_path / "code")
    handles = [svc.submit(TrialSpec("exp00001", f"Cap{i}", i, i, {}, "python3 s.py", tmp_path / "code", 1), code)
               for i in range(5)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            statuses = [svc.poll(h, {}).status for h in handles]
            if statuses.count(TrialStatus.RUNNING) == 5:
                break
            time.sleep(0.2)
        assert statuses == [TrialStatus.RUNNING] * 5  # 1 + 4 GPU slots: nobody waits for the full machine
        assert sorted(h.data["machine"] for h in handles).count(svc.machines[1].key) == 4
    finally:
        for h in handles:
            svc.cancel(h, TrialStatus.USER_CANCELED)
        svc.close()


@pytest.mark.parametrize(("reuse", "held"), [(False, False), (False, True), (True, False), (True, True)],
                         ids=["started-at-submit", "started-when-a-gpu-was-free", "reuse", "reuse-when-a-gpu-was-free"])
def test_a_trial_that_removes_its_own_directory_before_any_poll_is_stopped(tmp_path, sshd_servers, known_hosts,
                                                                           reuse, held):
    """A trial that removes its own directory as it starts, so its ``keeper.pid`` goes before the
    service reads it: the keeper its start said it forked (the submitting SSH command's answer, or the
    reuse worker's note) is stopped when the trial is found lost, whether it started at once or later,
    once the machine's GPU was free; in reuse mode the trial the worker took is not left waiting."""
    bin_dir = fake_nvidia_smi(tmp_path / "remote-bin", 1)
    os.symlink(sys.executable, bin_dir / "python3")
    machines = [machine(sshd_servers[0], tmp_path / "r0", pythonPath=str(bin_dir))]
    svc = remote_service(tmp_path, sshd_servers, known_hosts, machines=machines, trial_gpu_number=1,
                         reuse_mode=reuse)
    svc.prepare()
    pid_file = tmp_path / "trial.pid"
    write_trial(tmp_path / "code", "import os, shutil, time\n"
                f"open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
                f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
                "shutil.rmtree(os.environ['NNI_SYS_DIR'])\ntime.sleep(600)\n", "gone.py")
    write_trial(tmp_path / "code", "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n", "q.py")
    code = svc.upload_code(tmp_path / "code")
    first = svc.submit(TrialSpec("exp00001", "First", 0, 0, {}, "python3 q.py", tmp_path / "code", 1), code) \
        if held else None
    lost = svc.submit(TrialSpec("exp00001", "Gone1", 1, 1, {}, "python3 gone.py", tmp_path / "code", 1), code)
    trial_pid = None
    try:
        if first is not None:  # the lost trial waits for the GPU, then starts at a poll
            assert svc.poll(lost, {}).status == TrialStatus.WAITING
            assert poll_until_terminal(svc, first)[0][-1] == TrialStatus.SUCCEEDED
            svc.poll(lost, {})
        wait_for(lambda: pid_file.exists() and not Path(lost.data["trial_dir"]).exists(), timeout=30)
        trial_pid = int(pid_file.read_text())
        with pytest.raises(LostHandleError, match="no longer exists on .*; its processes were stopped"):
            svc.poll(lost, {})
        wait_for(lambda: not pid_alive(trial_pid), timeout=10)
    finally:
        if trial_pid is not None and pid_alive(trial_pid):
            os.kill(trial_pid, 9)
        svc.close()


def test_a_lost_trial_is_stopped_and_gives_its_gpu_to_the_trial_waiting_for_it(tmp_path, sshd_servers, known_hosts):
    """A trial whose directory on the machine is removed while it holds the machine's one GPU: the
    poll that finds it lost stops its processes there and releases the GPU, so the trial waiting for
    one starts."""
    bin_dir = fake_nvidia_smi(tmp_path / "remote-bin", 1)
    os.symlink(sys.executable, bin_dir / "python3")
    machines = [machine(sshd_servers[0], tmp_path / "r0", pythonPath=str(bin_dir))]
    svc = remote_service(tmp_path, sshd_servers, known_hosts, machines=machines, trial_gpu_number=1)
    svc.prepare()
    write_trial(tmp_path / "code", SLEEPING_TRIAL, "s.py")
    write_trial(tmp_path / "code", "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n", "q.py")
    code = svc.upload_code(tmp_path / "code")
    lost = svc.submit(TrialSpec("exp00001", "Lost1", 0, 0, {}, "python3 s.py", tmp_path / "code", 1), code)
    waiting = svc.submit(TrialSpec("exp00001", "Next1", 1, 1, {}, "python3 q.py", tmp_path / "code", 1), code)
    meta = Path(lost.data["trial_dir"]) / ".nni"
    keeper = None
    try:
        wait_for(lambda: svc.poll(lost, {}).status == TrialStatus.RUNNING, timeout=30)
        assert svc.poll(waiting, {}).status == TrialStatus.WAITING
        keeper = json.loads((meta / "keeper.pid").read_text())["pid"]
        shutil.rmtree(lost.data["trial_dir"])
        with pytest.raises(LostHandleError, match="no longer exists on .*; its processes were stopped"):
            svc.poll(lost, {})
        assert not group_alive(keeper)
        assert poll_until_terminal(svc, waiting)[0][-1] == TrialStatus.SUCCEEDED
    finally:
        if keeper is not None:
            kill_group(keeper, 0.5)
        svc.close()


def test_a_reuse_trial_whose_files_the_worker_writes_while_it_is_polled_is_not_lost(tmp_path, sshd_servers,
                                                                                   known_hosts, monkeypatch):
    """The poll reads the trial's files, then the worker's boxes. A worker that takes the trial, writes its
    files, starts its keeper and notes it between the two reads leaves a poll that found no files and a
    keeper noted: the trial is not lost (its files are looked at again), and it runs to its end."""
    import trialflow.platforms.remote as remote_module

    svc = remote_service(tmp_path, sshd_servers[:1], known_hosts, reuse_mode=True)
    svc.prepare()
    write_trial(tmp_path / "code", "import nni, time\nnni.get_next_parameter()\ntime.sleep(1)\n"
                "nni.report_final_result(1)\n", "s.py")
    code = svc.upload_code(tmp_path / "code")
    handle = svc.submit(TrialSpec("exp00001", "Race1", 0, 0, {}, "python3 s.py", tmp_path / "code"), code)
    try:
        note = Path(svc.machines[0].root) / "exp00001" / "env-0" / "taken" / "Race1.keeper"
        wait_for(note.exists, timeout=30)
        real = remote_module.read_trial
        reads = []

        def before_the_worker_wrote(fs, trial_dir, offset, trial_id):  # what a read just before it saw
            reads.append(trial_dir)
            return real(fs, trial_dir + ("-not-yet" if len(reads) == 1 else ""), offset, trial_id)

        monkeypatch.setattr(remote_module, "read_trial", before_the_worker_wrote)
        assert svc.poll(handle, {}).status in (TrialStatus.WAITING, TrialStatus.RUNNING)
        assert poll_until_terminal(svc, handle)[0][-1] == TrialStatus.SUCCEEDED
    finally:
        svc.close()


def test_a_run_queued_again_is_not_taken_for_started_before_the_worker_starts_it(tmp_path):
    """A reuse worker notes the keeper it started for a trial it took; a later run of that trial (after
    an interruption) is queued under the same id, and until the worker starts that run's keeper, the
    earlier run's keeper must not read as this run's (the service would call the run lost while the
    worker writes its files)."""
    env = EnvironmentDir(LocalFS(), str(tmp_path / "env"))
    (tmp_path / "env" / "taken").mkdir(parents=True)
    (tmp_path / "env" / "taken" / "T1.json").write_text("{}")
    (tmp_path / "env" / "taken" / "T1.keeper").write_text(json.dumps({"pid": 4242, "start_time": 17}))
    assert env.started_keeper("T1") == (4242, 17)
    env.enqueue("T1", {"trial_dir": "trials/T1"})
    assert env.started_keeper("T1") is None
    assert env.boxes_holding("T1") == {"queue", "taken"}
