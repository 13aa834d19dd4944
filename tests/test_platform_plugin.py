"""A platform of the user's own, from another package: ``examples/platform-plugin`` (``platform:
nice``) registered through the ``trialflow.platforms`` entry point passes the shipped contract
suite and runs an experiment end to end with ``trialflow create``, without any change to trialflow."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib
import yaml

from trialflow.experiments import open_store

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "platform-plugin"


def _install(site: Path) -> dict[str, str]:
    """What ``pip install ./examples/platform-plugin`` leaves in site-packages (the module and its
    dist-info with the entry points of its pyproject.toml), written here since the suite installs
    nothing from the network; returns the environment that sees it."""
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    site.mkdir()
    shutil.copy(PLUGIN / "trialflow_nice.py", site)
    info = site / f"trialflow_nice-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
                     for group, entries in project["entry-points"].items())
    (info / "entry_points.txt").write_text(points)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": "200"}


def test_the_plugin_platform_passes_the_shipped_contract_suite(tmp_path):
    env = _install(tmp_path / "site")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(PLUGIN),
                           str(PLUGIN / "tests")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_an_experiment_on_the_plugin_platform_runs_to_done_with_trialflow_create(tmp_path, prefect_server):
    env = {**_install(tmp_path / "site"), "PREFECT_API_URL": prefect_server, "TRIALFLOW_HOME": str(tmp_path / "h")}
    config = yaml.safe_load((PLUGIN / "config.yml").read_text())
    config.update(trialCodeDirectory=str(PLUGIN), experimentWorkingDirectory=str(tmp_path / "w"),
                  trialCommand=f"{sys.executable} trial.py")
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path), "--foreground"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    exp_id = done.stdout.split("experiment id:")[1].split()[0]
    store = open_store(tmp_path / "w", exp_id)
    try:
        assert store.experiment().status == "DONE"
        trials = store.trials()
        assert len(trials) == 4 and {t.status for t in trials} == {"SUCCEEDED"}
        by_trial: dict[str, list] = {}
        for metric in store.metrics():
            by_trial.setdefault(metric.trial_id, []).append(metric)
        for trial in trials:  # each ran at the niceness of the config, and reported its own parameter
            periodical = [m.value for m in by_trial[trial.id] if m.type == "PERIODICAL"]
            final = [m.value for m in by_trial[trial.id] if m.type == "FINAL"]
            assert periodical == [12] and final == [trial.parameters["x"]]
    finally:
        store.close()


def test_a_config_naming_no_installed_platform_still_gets_one_line(tmp_path):
    env = _install(tmp_path / "site")
    config = yaml.safe_load((PLUGIN / "config.yml").read_text())
    config.update(trialCodeDirectory=str(PLUGIN), experimentWorkingDirectory=str(tmp_path / "w"))
    config["trainingService"]["platform"] = "nicee"
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "trialflow.cli", "create", "--config", str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "platform must be one of" in done.stdout + done.stderr
    assert "nice (plugin)" in done.stdout + done.stderr  # the installed plugin is among the choices
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())


def test_nnictls_trainingservice_commands_list_the_installed_plugin_and_say_how_it_is_registered(tmp_path):
    def trialflow(*args: str, env: dict) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trialflow.cli", "trainingservice", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    bare = {**os.environ, "COLUMNS": "200"}
    assert trialflow("list", env=bare).stdout.split() == []
    env = _install(tmp_path / "site")
    listed = trialflow("list", env=env)
    assert (listed.returncode, listed.stdout.split()) == (0, ["nice"])
    for package in ("trialflow-nice", "trialflow_nice"):  # pip's name and its module's
        registered = trialflow("register", "--package", package, env=env)
        assert registered.returncode == 0 and f"{package} is registered: platform nice" in registered.stdout
    unregistered = trialflow("unregister", "--package", "trialflow_nice", env=env)
    assert unregistered.returncode == 1 and unregistered.stdout.count("\n") == 1
    assert "while it is installed: pip uninstall trialflow-nice" in unregistered.stdout
    assert trialflow("list", env=env).stdout.split() == ["nice"]  # nothing was changed
    for command in ("register", "unregister"):
        built_in = trialflow(command, "--package", "remote", env=env)
        assert built_in.returncode == 1 and "remote is a built-in training service" in built_in.stdout
        other = trialflow(command, "--package", "requests", env=env)  # installed, but no platform of its own
        assert other.returncode == 1 and other.stdout.count("\n") == 1 and other.stdout.startswith("error: requests")
