"""Top-level sharedStorage (NNI's fields): code and trial directories on a share that the controller
and the machines both see -- nothing uploaded per machine, trial output under
/nni/<exp>/trials/<trial>/nnioutput -- and the mount modes' errors."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import NFS_PATH, NFS_SERVER, base_config, k8s_section, machine, write_trial
from trialflow import parse_config, run_experiment
from trialflow.config import ConfigError
from trialflow.config.platforms import SharedStorageConfig
from trialflow.experiments import open_store
from trialflow.platforms import PlatformError
from trialflow.platforms.remote import RemoteTrainingService
from trialflow.platforms.share import Share, cache_key
from trialflow.platforms.trialfs import LocalFS

pytestmark = pytest.mark.usefixtures("prefect_server")

TRIAL = """
import os, nni
p = nni.get_next_parameter()
with open(os.path.join(os.environ["NNI_OUTPUT_DIR"], "out.txt"), "w") as f:
    f.write(nni.get_trial_id())
nni.report_intermediate_result(p["x"])
nni.report_final_result(p["x"] * 2)
"""


def _share(folder: Path, remote: Path | None = None, **fields) -> dict:
    return {"storageType": "NFS", "nfsServer": "127.0.0.1", "exportedDirectory": "/export",
            "localMountPoint": str(folder), "remoteMountPoint": str(remote or folder), "localMounted": "usermount",
            **fields}


def _remote_config(tmp_path, servers, known_hosts, share: dict, **overrides) -> dict:
    write_trial(tmp_path / "code", TRIAL)
    (tmp_path / "share").mkdir(exist_ok=True)
    service = {"platform": "remote", "knownHostsFile": str(known_hosts),
               "machineList": [machine(s, tmp_path / f"remote{i}") for i, s in enumerate(servers)],
               **overrides.pop("service", {})}
    return base_config(tmp_path / "code", tmp_path / "w", trainingService=service, sharedStorage=share,
                       **overrides)


def _check_outputs_on_share(share: Path, result) -> None:
    for trial in result.trials:
        output = share / "nni" / result.experiment_id / "trials" / trial.id / "nnioutput" / "out.txt"
        assert output.read_text() == trial.id


@pytest.mark.parametrize("reuse", [False, True], ids=["per-trial-ssh", "reuse"])
def test_remote_trials_use_the_share_and_nothing_is_uploaded(tmp_path, sshd_servers, known_hosts, reuse):
    config = _remote_config(tmp_path, sshd_servers, known_hosts, _share(tmp_path / "share"), maxTrialNumber=6,
                            trialConcurrency=3, service={"reuseMode": reuse})
    result = run_experiment(config)
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials)
    _check_outputs_on_share(tmp_path / "share", result)
    store = open_store(tmp_path / "w", result.experiment_id)
    for trial in result.trials:
        assert len(store.metrics(trial.id, "PERIODICAL")) == 1 and trial.final == pytest.approx(
            trial.parameters["x"] * 2)
    for i in range(2):  # no code bundle on any machine: the trials ran the one on the share
        assert not (tmp_path / f"remote{i}" / "code").exists()
    assert list((tmp_path / "share" / "nni" / "code").iterdir())


def test_code_bytes_sent_to_the_machines_with_and_without_a_share(tmp_path, sshd_servers, known_hosts):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "data.bin").write_bytes(os.urandom(2_000_000))
    sent = {}
    for label, share in (("plain", None), ("shared", _share(tmp_path / "share"))):
        config = _remote_config(tmp_path / label, sshd_servers, known_hosts, share or {})
        if share is None:
            config.pop("sharedStorage")
        config["trialCodeDirectory"] = str(tmp_path / "code")
        cfg = parse_config(config)
        (tmp_path / label / "w" / "exp").mkdir(parents=True)
        service = RemoteTrainingService(cfg.services[0], tmp_path / label / "w" / "exp")
        try:
            service.prepare()
            service.upload_code(tmp_path / "code")
        finally:
            service.close()
        sent[label] = service.uploaded_bytes
    assert sent["plain"] > 2 * 2_000_000  # the bundle went to both machines
    assert sent["shared"] == 0


def test_usermount_that_a_machine_does_not_see_is_an_error_naming_it(tmp_path, sshd_servers, known_hosts):
    elsewhere = tmp_path / "not-the-share"
    elsewhere.mkdir()
    config = _remote_config(tmp_path, sshd_servers[:1], known_hosts, _share(tmp_path / "share", elsewhere))
    with pytest.raises(PlatformError, match=rf"127\.0\.0\.1:{sshd_servers[0].port} does not see the NFS "
                                            rf"127\.0\.0\.1:/export share at remoteMountPoint {elsewhere}.*mount it "
                                            "there, or set sharedStorage.localMounted: nnimount"):
        run_experiment(config)


def test_local_trials_live_on_the_share(tmp_path):
    write_trial(tmp_path / "code", TRIAL)
    (tmp_path / "share").mkdir()
    config = base_config(tmp_path / "code", tmp_path / "w", sharedStorage=_share(tmp_path / "share"))
    result = run_experiment(config)
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials)
    _check_outputs_on_share(tmp_path / "share", result)


def _fake_tool(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)


def _own_tmpdir(tmp_path: Path, monkeypatch) -> Path:
    """A TMPDIR of the test's own (blobfuse's cache folder goes there, not into the machine's /tmp)."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    return tmp_path / "tmp"


def _stand_in_blobfuse(tmp_path: Path, monkeypatch, body: str) -> None:
    """blobfuse running ``body``, and a sudo that passes through (not root in every CI), first on PATH;
    a TMPDIR of the test's own."""
    _fake_tool(tmp_path / "bin", "blobfuse", body)
    _fake_tool(tmp_path / "bin", "sudo", 'shift; exec "$@"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    _own_tmpdir(tmp_path, monkeypatch)


def test_nnimount_runs_blobfuse_with_the_key_in_a_private_file(tmp_path, monkeypatch):
    record = tmp_path / "blobfuse-call"
    # Records its arguments and the config file's mode and content, as the real one would read them.
    _stand_in_blobfuse(tmp_path, monkeypatch, f'echo "$@" > {record}; cfg="${{3#--config-file=}}"; '
                       f'stat -c %a "$cfg" >> {record}; cat "$cfg" >> {record}\n')
    write_trial(tmp_path / "code", TRIAL)
    (tmp_path / "blob").mkdir()
    share = _blob_share(tmp_path / "blob")
    result = run_experiment(base_config(tmp_path / "code", tmp_path / "w", sharedStorage=share, maxTrialNumber=1))
    assert result.status == "DONE"
    args, mode, *cfg = record.read_text().splitlines()
    # blobfuse caches the share's files in a folder of this user's own, one per mount point
    cache = Path(args.split("--tmp-path=")[1].split()[0])
    assert cache.parent == tmp_path / "tmp" / f"trialflow-blobfuse-{os.getuid()}"
    assert stat.S_IMODE(cache.stat().st_mode) == stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    assert args.startswith(f"{tmp_path / 'blob'} --tmp-path=") and "s3cr3t" not in args
    assert mode == "600" and cfg == ["accountName acct", "accountKey s3cr3t-key-value", "containerName box"]
    config_file = args.split("--config-file=")[1].split()[0]
    assert not Path(config_file).exists()  # removed after the mount
    _check_outputs_on_share(tmp_path / "blob", result)
    stored = (tmp_path / "w" / result.experiment_id).rglob("*")
    assert not any("s3cr3t" in p.read_text(errors="ignore") for p in stored if p.is_file() and
                   stat.S_ISREG(p.stat().st_mode) and p.stat().st_size < 1_000_000)


def _blob_share(mount_point: Path) -> dict:
    return {"storageType": "AzureBlob", "storageAccountName": "acct", "containerName": "box",
            "storageAccountKey": "s3cr3t-key-value", "localMountPoint": str(mount_point),
            "remoteMountPoint": "/mnt/blob", "localMounted": "nnimount"}


@pytest.mark.parametrize("planted", ["another-user-s-folder", "a-link", "another-user-s-inner-folder"])
@pytest.mark.parametrize("where", ["here", "on-a-machine"])
def test_blobfuse_s_cache_folder_planted_by_someone_else_stops_the_mount(tmp_path, monkeypatch, planted, where):
    """Another user of the machine who makes blobfuse's cache folder first (or links it elsewhere) would
    read the share's files as blobfuse caches them: the mount stops with one line naming the folder,
    before blobfuse runs, and nothing is written where the link points."""
    if planted != "a-link" and os.geteuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    record, elsewhere = tmp_path / "blobfuse-call", tmp_path / "elsewhere"
    _stand_in_blobfuse(tmp_path, monkeypatch, f'echo "$@" > {record}\n')
    elsewhere.mkdir()
    top = tmp_path / "tmp" / f"trialflow-blobfuse-{os.getuid()}"
    share = Share(SharedStorageConfig.model_validate(_blob_share(tmp_path / "blob")), "exp")
    if planted == "a-link":
        top.symlink_to(elsewhere)
        named = top
    else:
        if planted == "another-user-s-inner-folder":  # this user's folder, left open; the other made the inner one
            top.mkdir(mode=0o777)
            named = top / cache_key(str(tmp_path / "blob"))
        else:
            named = top
        named.mkdir(mode=0o777)
        os.chown(named, 65534, 65534)
    with pytest.raises(PlatformError, match=rf"blobfuse's cache folder {re.escape(str(named))} is not a folder of your "
                                            "own .*remove it, or set TMPDIR to a folder of yours") as err:
        if where == "here":
            share.prepare_local()
        else:  # the command as a training machine's shell gets it
            def run(command: str) -> tuple[int, str, str]:
                done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
                return done.returncode, done.stdout, done.stderr
            share._mount_there(LocalFS(), run, str(tmp_path), str(tmp_path / "blob"))
    assert "\n" not in str(err.value) and "s3cr3t" not in str(err.value)
    assert not record.exists() and list(elsewhere.iterdir()) == []
    assert not list(tmp_path.glob(".blobfuse-*.cfg"))  # the key's file is gone too


def test_nnimount_errors_name_the_tool_and_the_fix(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    _fake_tool(bin_dir, "blobfuse", 'echo "fuse: failed to open /dev/fuse: Permission denied" >&2; exit 1\n')
    _fake_tool(bin_dir, "sudo", 'shift; exec "$@"\n')
    _own_tmpdir(tmp_path, monkeypatch)
    write_trial(tmp_path / "code", TRIAL)
    (tmp_path / "blob").mkdir()
    config = base_config(tmp_path / "code", tmp_path / "w", sharedStorage=_blob_share(tmp_path / "blob"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no blobfuse anywhere
    with pytest.raises(PlatformError, match="nnimount needs blobfuse on this machine: install blobfuse") as err:
        run_experiment(config)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(PlatformError, match="mounting the AzureBlob acct/box share at .* failed.*Permission denied"
                                            ".*root or passwordless sudo") as err:
        run_experiment(config)
    assert "s3cr3t" not in str(err.value)


def test_share_fields_that_cannot_work_are_refused(tmp_path):
    write_trial(tmp_path / "code", TRIAL)
    with pytest.raises(ConfigError, match="localMounted: nomount is not supported"):
        parse_config(base_config(tmp_path / "code", tmp_path / "w",
                                 sharedStorage=_share(tmp_path, localMounted="nomount")))
    kube = k8s_section("tfjob", tmp_path)  # its own storage, not the share's
    with pytest.raises(ConfigError, match=r"trainingService.storage and sharedStorage name different shares"):
        parse_config(base_config(tmp_path / "code", tmp_path / "w", trainingService=kube,
                                 sharedStorage={**_share(tmp_path), "exportedDirectory": "/other"}))
    dlts = {"platform": "dlts", "dashboard": "http://127.0.0.1:9", "cluster": "c", "team": "t", "email": "e@x",
            "password": "pw-1", "localStorageMountPoint": str(tmp_path), "containerStorageMountPoint": "/work"}
    with pytest.raises(ConfigError, match=r"trainingService \(dlts\) keeps code and trials on its own storage"):
        parse_config(base_config(tmp_path / "code", tmp_path / "w", trainingService=dlts,
                                 sharedStorage=_share(tmp_path)))


def test_kubeflow_without_storage_uses_an_nfs_share(tmp_path, k8s):
    write_trial(tmp_path / "code", TRIAL)
    section = k8s_section("tfjob", k8s.nfs_dir, command="python3 trial.py")
    section.pop("storage")
    share = {"storageType": "NFS", "nfsServer": NFS_SERVER, "exportedDirectory": NFS_PATH,
             "localMountPoint": str(k8s.nfs_dir), "remoteMountPoint": "/mnt/share", "localMounted": "usermount"}
    result = run_experiment(base_config(tmp_path / "code", tmp_path / "w", trainingService=section,
                                        sharedStorage=share, trialCommand="python3 trial.py", maxTrialNumber=2))
    assert result.status == "DONE" and all(t.status == "SUCCEEDED" for t in result.trials)
    jobs = [j for j in k8s.objects("tfjobs") if j["metadata"]["labels"].get("expId") == result.experiment_id]
    container = jobs[0]["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["volumeMounts"] == [{"name": "nni-vol", "mountPath": "/mnt/share"}]
    for trial in result.trials:
        assert (k8s.nfs_dir / "nni" / result.experiment_id / "trials" / trial.id / "out.txt").read_text() == trial.id
