"""``experiment load`` of packages made by hand to escape or lie: nothing is written outside
``--logDir`` (or at all) unless the package is what `experiment save` writes."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.conftest import base_config, write_trial
from trialflow.app.experiment_archive import ArchiveError, load_experiment, save_experiment
from trialflow.config import parse_config
from trialflow.experiments import create_experiment, open_store


@pytest.fixture
def saved(tmp_path, monkeypatch) -> tuple[str, Path]:
    """(experiment id, package) of a created experiment, saved with its code, then loaded as on another
    machine (TRIALFLOW_HOME of its own: the original's folder is not known there)."""
    code = tmp_path / "code"
    write_trial(code, "print('hi')\n")
    exp_id, exp_dir = create_experiment(parse_config(base_config(code, tmp_path / "w")))
    store = open_store(tmp_path / "w", exp_id)
    try:
        package = save_experiment(store, exp_dir, tmp_path / "packages", with_code=True)
    finally:
        store.close()
    monkeypatch.setenv("TRIALFLOW_HOME", str(tmp_path / "other-machine"))
    return exp_id, package


def _rewritten(package: Path, out: Path, **manifest) -> Path:
    """``package`` with its manifest's fields replaced."""
    with tarfile.open(package, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            if member.name == "manifest.json":
                body = json.dumps({**json.loads(data.read()), **manifest}).encode()
                member.size, data = len(body), io.BytesIO(body)
            dst.addfile(member, data)
    return out


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.mark.parametrize("crafted_id", ["../../escaped", "/tmp/trialflow-absolute", "..", "ABCDEFGH", 42])
def test_a_manifest_id_that_is_a_path_or_no_id_writes_nothing(tmp_path, saved, crafted_id):
    _, package = saved
    crafted = _rewritten(package, tmp_path / "crafted.tar.gz", id=crafted_id)
    log_dir = tmp_path / "loaded" / "w"
    with pytest.raises(ArchiveError, match="no experiment id") as raised:
        load_experiment(crafted, tmp_path / "code2", log_dir)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "loaded").exists() and not (tmp_path / "escaped").exists()
    assert not Path("/tmp/trialflow-absolute").exists() and not (tmp_path / "code2").exists()


def test_a_manifest_naming_another_experiment_than_its_store_is_refused_and_leaves_nothing(tmp_path, saved):
    _, package = saved
    crafted = _rewritten(package, tmp_path / "crafted.tar.gz", id="zzzz9999")
    log_dir = tmp_path / "loaded"
    with pytest.raises(ArchiveError, match="does not hold it: it was not written by"):
        load_experiment(crafted, tmp_path / "code2", log_dir)
    assert _files(log_dir) == [] and not (tmp_path / "code2").exists()


def test_an_experiment_known_in_another_working_directory_is_not_loaded_twice(tmp_path, saved, monkeypatch):
    exp_id, package = saved
    monkeypatch.setenv("TRIALFLOW_HOME", str(tmp_path / "experiments"))  # the machine it was saved on
    with pytest.raises(ArchiveError, match=f"experiment {exp_id} is already in {tmp_path / 'w'}"):
        load_experiment(package, tmp_path / "code2", tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "code2").exists()
    monkeypatch.setenv("TRIALFLOW_HOME", str(tmp_path / "other-machine"))
    assert load_experiment(package, tmp_path / "code2", tmp_path / "first") == exp_id  # registered there
    with pytest.raises(ArchiveError, match=f"experiment {exp_id} is already in {tmp_path / 'first'}"):
        load_experiment(package, tmp_path / "code3", tmp_path / "second")
    assert not (tmp_path / "second").exists() and not (tmp_path / "code3").exists()


def test_a_package_larger_than_the_free_space_says_so_and_writes_nothing(tmp_path, saved, monkeypatch):
    _, package = saved
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=100))
    with pytest.raises(ArchiveError, match=r"no space left on .* it unpacks to .* MiB, 0\.0 MiB are free"):
        load_experiment(package, tmp_path / "code2", tmp_path / "loaded")
    assert not (tmp_path / "loaded").exists()


def test_a_saved_package_still_loads_and_opens(tmp_path, saved):
    exp_id, package = saved
    assert load_experiment(package, tmp_path / "code2", tmp_path / "loaded") == exp_id
    store = open_store(tmp_path / "loaded", exp_id)
    try:
        assert store.experiment().config["trialCodeDirectory"] == str((tmp_path / "code2").resolve())
    finally:
        store.close()
    assert (tmp_path / "code2" / "trial.py").is_file()


def test_a_package_whose_store_is_no_database_is_one_line_and_leaves_nothing(tmp_path, saved):
    exp_id, package = saved
    crafted = tmp_path / "junk.tar.gz"
    with tarfile.open(package, "r:gz") as src, tarfile.open(crafted, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            if member.name.endswith("trialflow.sqlite"):
                member.size, data = 10, io.BytesIO(b"not sqlite")
            dst.addfile(member, data)
    with pytest.raises(ArchiveError, match="holds a store that cannot be read"):
        load_experiment(crafted, tmp_path / "code2", tmp_path / "loaded")
    assert _files(tmp_path / "loaded") == []


# ---- save packs the experiment's own code; load repoints every code path --------------------------

MARKED_TRIAL = "import nni\nnni.get_next_parameter()\nnni.report_final_result(float(open('marker').read()))\n"


def _v2_experiment(tmp_path: Path, **overrides) -> tuple[str, Path, Path]:
    """(id, experiment folder, code folder) of an NNI v2 config whose code folder is named only in
    its trainingService section, with a `.nniignore`d data folder and a config file inside."""
    code = tmp_path / "code"
    write_trial(code, MARKED_TRIAL)
    (code / "marker").write_text("1")
    (code / "data").mkdir()
    (code / "data" / "big.bin").write_bytes(b"x" * 1000)
    (code / ".nniignore").write_text("data/\n")
    config = base_config(code, tmp_path / "w", maxTrialNumber=1, **overrides)
    del config["trialCodeDirectory"]
    config["trainingService"] = {"platform": "local", "trialCodeDirectory": str(code)}
    (code / "config.yml").write_text(json.dumps(config))
    from trialflow.config import load_config

    exp_id, exp_dir = create_experiment(load_config(code / "config.yml"), str(code / "config.yml"))
    return exp_id, exp_dir, code


def _members(package: Path) -> set[str]:
    with tarfile.open(package, "r:gz") as tar:
        return {m.name for m in tar.getmembers()}


def test_save_packs_the_experiments_code_wherever_it_runs_and_never_overwrites(tmp_path, monkeypatch):
    exp_id, exp_dir, code = _v2_experiment(tmp_path)
    elsewhere = tmp_path / "work-folder"  # the folder the command runs in, full of other things
    (elsewhere / "venv").mkdir(parents=True)
    (elsewhere / "venv" / "python").write_text("not code")
    monkeypatch.chdir(elsewhere)
    store = open_store(tmp_path / "w", exp_id)
    try:
        package = save_experiment(store, exp_dir, tmp_path / "pkg", with_code=True)
        code_files = {m for m in _members(package) if m.startswith("code")}
        assert code_files == {"code/trial.py", "code/marker", "code/.nniignore"}  # ignored data, config left out
        with pytest.raises(ArchiveError, match="already exists; give --force"):
            save_experiment(store, exp_dir, tmp_path / "pkg", with_code=False)
        assert "code/trial.py" in _members(package)  # the first package is untouched
        save_experiment(store, exp_dir, tmp_path / "pkg", with_code=False, force=True)
        assert not {m for m in _members(package) if m.startswith("code")}
        assert [p.name for p in (tmp_path / "pkg").iterdir()] == [package.name]  # no partial file left
    finally:
        store.close()


@pytest.mark.e2e
def test_a_loaded_experiment_resumed_runs_its_new_trials_in_the_loaded_code(tmp_path, prefect_server):
    from tests.test_cli import cli

    exp_id, exp_dir, code = _v2_experiment(tmp_path)
    env = {"TRIALFLOW_HOME": str(tmp_path / "w")}
    first = cli("resume", exp_id, "--foreground", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    saved = cli("experiment", "save", exp_id, "--path", str(tmp_path / "pkg"), "-s", env=env)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    (code / "marker").write_text("999")  # the original changes after the save: a loaded run must not see it
    other = {"TRIALFLOW_HOME": str(tmp_path / "other-machine")}
    package = tmp_path / "pkg" / f"trialflow_experiment_{exp_id}.tar.gz"
    loaded = cli("experiment", "load", "-p", str(package), "-c", str(tmp_path / "code2"), "-l",
                 str(tmp_path / "w2"), env=other)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    config = open_store(tmp_path / "w2", exp_id).experiment().config
    assert config["trainingService"]["trialCodeDirectory"] == str(tmp_path / "code2")
    resumed = cli("resume", exp_id, "--trialnum", "2", "--foreground", "--root", str(tmp_path / "w2"), env=other)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    store = open_store(tmp_path / "w2", exp_id)
    try:
        trials = store.trials()
    finally:
        store.close()
    assert [(t.status, t.final) for t in trials] == [("SUCCEEDED", 1.0), ("SUCCEEDED", 1.0)]
    assert trials[1].log_dir.startswith(str(tmp_path / "w2"))
