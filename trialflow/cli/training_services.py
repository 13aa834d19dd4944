"""NNI's ``trainingservice`` commands over trialflow's platform plugins: a package registers its platforms
through the ``trialflow.platforms`` entry point group when it is installed
(docs/platforms.md#third-party-platforms), so ``list`` shows them and ``register``/``unregister`` say how
a package is registered; none of them changes anything."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer

from .common import CliError, console

training_service_app = typer.Typer(help="Platforms from other packages (NNI's trainingservice): list them.",
                                   no_args_is_help=True)
PackageOpt = Annotated[str, typer.Option("--package", help="the package's name (pip's) or its module's")]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _built_in(package: str) -> None:
    """Raise when ``package`` names a built-in platform, as NNI's commands refuse one."""
    from ..platforms.table import PLATFORMS

    if package in PLATFORMS:
        raise CliError(f"{package} is a built-in training service: it needs no registering")


def _entry_points(package: str) -> list[Any]:
    """The ``trialflow.platforms`` entry points the installed package ``package`` (a distribution or
    module name) declares."""
    from importlib.metadata import entry_points

    from ..config.plugins import GROUP

    wanted = _canonical(package)
    return [point for point in entry_points(group=GROUP)
            if wanted in {_canonical(point.dist.name if point.dist else ""), _canonical(point.module.split(".")[0])}]


@training_service_app.command("list")
def list_services() -> None:
    """The platforms other packages registered (their trialflow.platforms entry points), one per line."""
    from ..platforms.table import plugin_rows

    for name in plugin_rows():
        console.print(name, highlight=False)


@training_service_app.command("register")
def register(package: PackageOpt) -> None:
    """Say whether the installed package registers a platform: installing a package registers the
    platforms of its trialflow.platforms entry point, so there is nothing more to do."""
    _built_in(package)
    points = _entry_points(package)
    if not points:
        raise CliError(f"{package} registers no trialflow platform: a platform package names its platform in the "
                       "trialflow.platforms entry point group, and pip install registers it "
                       "(docs/platforms.md#third-party-platforms)")
    console.print(f"{package} is registered: platform {', '.join(p.name for p in points)} (its trialflow.platforms "
                  "entry point, read when a config names the platform)", highlight=False, soft_wrap=True)


@training_service_app.command("unregister")
def unregister(package: PackageOpt) -> None:
    """Say how a package's platforms go: they stay registered while the package is installed."""
    _built_in(package)
    points = _entry_points(package)
    if not points:
        raise CliError(f"{package} is not a registered training service (trialflow trainingservice list)")
    dist = points[0].dist.name if points[0].dist else package
    raise CliError(f"{package} registers platform {', '.join(p.name for p in points)} while it is installed: "
                   f"pip uninstall {dist}")
