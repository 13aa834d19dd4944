"""docs/security.md, the threat model, is complete: every CLI command, network listener and secret
field has a row, and every test a row names exists."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "security.md").read_text()
# what opens a listening socket in trialflow (its own servers, or a server process it starts)
LISTENING = re.compile(r"\.bind\(|HTTPServer|serve_forever|uvicorn|\"--host\", \w+, \"--port\"|create_server\(")


def _commands() -> list[str]:
    from typer.main import get_command

    from trialflow.cli import app

    found = []

    def walk(command, path: str) -> None:
        children = getattr(command, "commands", None)
        if children:
            for name, child in children.items():
                walk(child, f"{path} {name}".strip())
        elif not path.split()[-1].startswith("_"):  # the controller's own entry, not a user's command
            found.append(path)

    walk(get_command(app), "")
    return found


def test_every_cli_command_has_a_row():
    missing = [c for c in _commands() if f"`trialflow {c}`" not in DOC]
    assert not missing, f"docs/security.md has no row for: {missing}"


def test_every_module_that_listens_has_a_row():
    modules = []
    for path in sorted((ROOT / "trialflow").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if "testing" in rel.parts or not LISTENING.search(path.read_text()):
            continue
        modules.append(".".join(rel.with_suffix("").parts))
    assert "trialflow.server.kept_server_app" in modules and "trialflow.platforms.metrics_receiver" in modules
    missing = [m for m in modules if f"`{m}`" not in DOC]
    assert not missing, f"docs/security.md has no row for these listeners: {missing}"


def _secret_fields(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items() if "SecretStr" in str(field.annotation)}


def test_every_secret_field_of_configs_and_blocks_has_a_row():
    import importlib

    import trialflow.config.experiment as experiment_config
    import trialflow.config.platforms as platform_configs
    from trialflow.blocks import aml, dlc, dlts, kubernetes, mlflow, openpai, remote

    sections = [importlib.import_module(f"trialflow.config.sections.{path.stem}")
                for path in sorted((ROOT / "trialflow" / "config" / "sections").glob("*.py"))]
    models = [obj for module in (experiment_config, platform_configs, *sections, aml, dlc, dlts, kubernetes, mlflow,
                                 openpai, remote)
              for obj in vars(module).values() if isinstance(obj, type) and issubclass(obj, BaseModel)]
    names = set().union(*(_secret_fields(m) for m in models))
    assert {"password", "sshPassphrase", "storeUrl", "kubeconfig"} <= names, names
    missing = sorted(n for n in names if f"`{n}`" not in DOC)
    assert not missing, f"docs/security.md has no row for these secret fields: {missing}"


def test_every_test_a_row_names_exists():
    named = set(re.findall(r"`?(tests/[\w/]+\.py)::(\w+)`?", DOC))
    assert len(named) > 20
    missing = [f"{file}::{test}" for file, test in sorted(named)
               if not (ROOT / file).is_file() or not re.search(rf"def {test}\(", (ROOT / file).read_text())]
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
