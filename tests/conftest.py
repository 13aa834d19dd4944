"""Shared fixtures: an isolated Prefect test server (one per session), isolated homes, trial scripts."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

PYTHON = sys.executable


@pytest.fixture(scope="session")
def prefect_server():
    """A throwaway Prefect API (temp DB) for tests that run flows; yields its URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALFLOW_HOME", str(tmp_path / "experiments"))
    return tmp_path


def write_trial(directory: Path, body: str, name: str = "trial.py") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def base_config(code_dir: Path, workdir: Path, **overrides) -> dict:
    config = {
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
        "trialCommand": f"{PYTHON} trial.py",
        "trialCodeDirectory": str(code_dir),
        "trialConcurrency": 2,
        "maxTrialNumber": 4,
        "experimentWorkingDirectory": str(workdir),
        "tuner": {"name": "Random", "classArgs": {"seed": 1}},
        "trainingService": {"platform": "local"},
    }
    config.update(overrides)
    return config
