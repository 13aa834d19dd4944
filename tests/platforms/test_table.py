"""The platform table and the layers: one row per platform, the same names as the config loader's,
a credentials block for every platform that needs one, platforms below the Prefect task library."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from prefect import Task
from prefect.blocks.core import Block
from pydantic import SecretStr

import trialflow.tasks
from trialflow.config import PLATFORM_CONFIGS
from trialflow.platforms import PLATFORMS, PlatformError, TrainingService, available, create_service

PACKAGE = Path(trialflow.tasks.__file__).resolve().parents[1]


def test_every_platform_has_one_row_with_the_loaders_name_and_a_service():
    assert sorted(PLATFORMS) == sorted(PLATFORM_CONFIGS)
    assert set(PLATFORMS) <= set(available())  # and the rows a test or plugin registered
    for name, row in PLATFORMS.items():
        assert row.config is PLATFORM_CONFIGS[name]
        assert row.service is not None and issubclass(row.service, TrainingService), name
        assert row.retry.retries >= 1 and row.retry.delays() == sorted(row.retry.delays())


def test_every_built_in_platform_is_one_module_pair_its_section_named_as_its_service():
    """``config/sections/<name>.py`` holds the section, ``platforms/<name>.py`` the service and its row."""
    for name, row in PLATFORMS.items():
        package, _, module = row.config.__module__.rpartition(".")
        assert package == "trialflow.config.sections", name
        assert row.service is not None and row.service.__module__ == f"trialflow.platforms.{module}", name
        assert vars(importlib.import_module(row.service.__module__))["PLATFORM"] is row, name


def test_prefects_block_register_command_finds_every_block_the_blocks_package_defines():
    """``prefect block register -m trialflow.blocks`` registers the block classes that are names of the
    package: every block class of its modules is one, a new platform's block included."""
    import trialflow.blocks

    defined = set()
    for path in sorted((PACKAGE / "blocks").glob("[!_]*.py")):
        module = importlib.import_module(f"trialflow.blocks.{path.stem}")
        defined |= {obj for obj in vars(module).values()
                    if isinstance(obj, type) and Block.is_block_class(obj) and obj.__module__ == module.__name__}
    named = {obj for _, obj in inspect.getmembers(trialflow.blocks) if obj is not None and Block.is_block_class(obj)}
    assert len(defined) >= 8 and named == defined


def test_every_remote_platform_has_a_credentials_block_with_secret_fields():
    for name, row in PLATFORMS.items():
        if name in ("local", "prefect"):  # this machine; the controller's own Prefect server
            assert row.block is None
            continue
        assert row.block is not None and issubclass(row.block, Block), name
        secrets = [f for f, info in row.block.model_fields.items() if "SecretStr" in str(info.annotation)]
        assert secrets, f"{name}: its block holds no SecretStr field"
        assert all(info.description for info in row.block.model_fields.values()), f"{name}: undescribed field"
    assert SecretStr  # the annotation checked above


def test_a_platform_without_a_service_is_refused_naming_the_available_ones(tmp_path, monkeypatch):
    from trialflow.platforms import table

    rows = {**PLATFORMS, "aml": table.Platform(PLATFORM_CONFIGS["aml"], None)}  # a row not built yet
    monkeypatch.setattr(table, "PLATFORMS", rows)
    config = PLATFORM_CONFIGS["aml"].model_construct(platform="aml")
    with pytest.raises(PlatformError, match="'aml' training service is not available") as err:
        create_service(config, tmp_path / "exp")
    assert all(name in str(err.value) for name in available())


def test_looking_up_one_platform_imports_that_platform_s_service_module_only():
    """A process that runs one platform (a controller) pays for that platform's client libraries only:
    the table reads a built-in row when it is first looked up."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from trialflow.platforms import platform\n"
            "assert platform('local').name == 'local'\n"
            "print(sorted(m for m in sys.modules if m.startswith('trialflow.platforms.') and m.split('.')[2] in "
            "{'remote', 'openpai', 'kubeflow', 'aml', 'dlc', 'slurm'}), 'paramiko' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["[]", "False"], (done.stdout, done.stderr)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_platforms_sit_below_the_prefect_layers_and_blocks_below_platforms():
    for path in (PACKAGE / "platforms").glob("*.py"):
        speaks_prefect = path.name == "prefect_pool.py"  # the work-pool platform drives Prefect's API itself
        logs_to_prefect = path.name == "trial_output.py"  # a trial's output goes out through Prefect's log handler
        bad = {n for n in _imports(path) if n.lstrip(".").split(".")[0] in ("tasks", "flows", "experiments", "cli")
               or n.startswith("prefect") and not n.startswith("prefect.blocks") and not speaks_prefect
               and not (logs_to_prefect and n.startswith("prefect.logging"))}
        assert not bad, f"{path.name} imports {bad}"
    for path in (PACKAGE / "blocks").glob("*.py"):
        assert not {n for n in _imports(path) if "platforms" in n}, path.name


def test_the_task_library_holds_prefect_tasks():
    exported = [getattr(trialflow.tasks, name) for name in trialflow.tasks.__all__]
    assert [t.name for t in exported] == ["poll_trial", "submit_trial", "suggest_parameters", "upload_code"]
    assert all(isinstance(t, Task) for t in exported)
    for path in (PACKAGE / "tasks").glob("*.py"):
        tree = ast.parse(path.read_text())
        classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        assert not classes, f"tasks/{path.name} defines classes {classes}: they belong below the task library"


def test_a_call_outside_a_task_is_retried_on_transient_errors_only():
    from trialflow.platforms import RetryPolicy, TransientPlatformError

    policy, calls, waits = RetryPolicy(retries=3, delay=0.01), [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise TransientPlatformError("HTTP 502")
        return "ready"

    assert policy.call(flaky, lambda exc, delay: waits.append(delay)) == "ready"
    assert len(calls) == 3 and waits == [0.01, 0.02]
    calls.clear()

    def refused():
        calls.append(1)
        raise PlatformError("credentials refused")

    with pytest.raises(PlatformError, match="refused"):
        policy.call(refused)
    assert len(calls) == 1
    with pytest.raises(TransientPlatformError):
        policy.call(lambda: (_ for _ in ()).throw(TransientPlatformError("still down")))


def test_only_the_command_line_and_presentation_itself_import_the_presentation_modules():
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("presentation", "cli"):
            continue
        bad = {n for n in _imports(path) if "presentation" in n}
        assert not bad, f"{relative} imports {bad}"


@pytest.mark.parametrize("status,transient", [(None, True), (0, True), (429, True), (500, True), (503, True),
                                              (400, False), (404, False), (409, False), (401, False)])
def test_every_http_platform_classifies_a_failure_the_same_way(status, transient):
    """The one classifier: the Prefect work pool now retries a 429 as the REST, Kubernetes, DLC and
    Azure ML platforms do, and a refused credential names what to check on every platform."""
    import httpx

    from trialflow.platforms import TransientPlatformError
    from trialflow.platforms.errors import http_error
    from trialflow.platforms.prefect_pool import PrefectWorkPoolService

    error = http_error(status, "failed", "refused: check the key")
    assert isinstance(error, TransientPlatformError) == transient
    assert str(error) == ("refused: check the key" if status == 401 else "failed")
    if not status:
        return
    pool = PrefectWorkPoolService.__new__(PrefectWorkPoolService)  # only _call's classification is used

    def answer() -> None:
        request = httpx.Request("GET", "http://127.0.0.1:1/api/work_pools/p")
        raise httpx.HTTPStatusError("no", request=request, response=httpx.Response(status, request=request))

    with pytest.raises(PlatformError) as caught:
        pool._call("read_work_pool", answer)  # noqa: SLF001
    assert isinstance(caught.value, TransientPlatformError) == transient
    assert ("PREFECT_API_KEY" in str(caught.value)) == (status == 401)


def test_a_platform_registered_after_a_failed_lookup_is_found_from_then_on(monkeypatch):
    """The plugin rows are read at each lookup: an unknown name looked up first (a config naming it
    before its package was registered) does not hide a row registered later in the process."""
    from typing import Literal

    from trialflow.config import LocalConfig, parse_config, plugins
    from trialflow.platforms import platform
    from trialflow.platforms.local import LocalTrainingService
    from trialflow.platforms.table import Platform

    class LateConfig(LocalConfig):
        platform: Literal["latecomer"] = "latecomer"  # type: ignore[assignment]

    monkeypatch.setattr(plugins, "_REGISTERED", {})
    with pytest.raises(PlatformError, match="unknown platform 'latecomer'"):
        platform("latecomer")
    row = Platform(LateConfig, LocalTrainingService)
    plugins.register_platform(row)
    assert platform("latecomer") is row and "latecomer" in available()
    config = parse_config({"searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "python3 t.py",
                           "trialCodeDirectory": str(PACKAGE), "trialConcurrency": 1,
                           "tuner": {"name": "Random"}, "trainingService": {"platform": "latecomer"}})
    assert isinstance(config.services[0], LateConfig)
