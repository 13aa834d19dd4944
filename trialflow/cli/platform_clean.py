"""The ``platform clean`` command: remove what trialflow made on a config's training platform."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import _config, _platforms, console

platform_app = typer.Typer(help="Clean up what trialflow left on training platforms.", no_args_is_help=True)


@platform_app.command("clean")
def platform_clean(config: Annotated[Path, typer.Option("--config", "-c", help="the experiment config naming the "
                                                        "platform (its machines, cluster storage)")],
                   yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False) -> None:
    """Remove what trialflow made on the config's platform for every experiment (the code bundles,
    runtimes and experiment folders it marked as its own under remoteWorkingDirectory or on the share),
    after listing them. Nothing else there is touched. Trials still running there lose their folders:
    stop them first."""
    import tempfile

    cfg = _config.load_config(config)
    names = ", ".join(s.platform for s in cfg.services)
    with tempfile.TemporaryDirectory() as scratch:
        service = _platforms.experiment_service(cfg, Path(scratch) / "platform-clean")
        try:
            planned = service.clean(dry_run=True)
            if not planned:
                console.print(f"{names}: nothing there is trialflow's to remove", highlight=False)
                return
            for where in planned:
                console.print(f"trialflow's: {where}", soft_wrap=True, highlight=False)
            if not yes and not typer.confirm(f"remove the {len(planned)} listed above?"):
                raise typer.Exit(1)
            removed = service.clean()
        finally:
            service.close()
    for where in removed:
        console.print(f"removed {where}", soft_wrap=True, highlight=False)
