"""``trialflow``: nnictl-style commands (typer + rich), one module per command group; the whole command
tree is registered here, in the order ``--help`` lists it.

Errors exit non-zero with one ``error:`` line naming what is wrong and how to fix it (config errors
list one line per bad field). Experiments run in a detached background process by default, like
``nnictl create``; ``--foreground`` runs in this terminal with a live progress display.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..foundation.startup_gc import no_collection_at_exit
from ..foundation.user_errors import UserError
from ..records.disk_space import no_space
from . import algorithms, experiments, hello, platform_clean, running, server, training_services, trials, watching
from .common import CliError, _config, console

__all__ = ["CliError", "app", "main"]

app = typer.Typer(help="Hyperparameter-tuning experiments on Prefect (NNI-compatible).", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
app.command()(running.create)
app.command()(running.resume)
app.command("_run", hidden=True)(running.run_detached)
app.command()(watching.view)
app.command("dashboard")(watching.dashboard_command)
app.command()(running.stop)
app.command()(running.top)
app.command("ss_gen")(algorithms.ss_gen)
app.command()(hello.hello)
for _name, _group in (("experiment", experiments.experiment_app), ("trial", trials.trial_app),
                      ("log", trials.log_app), ("update", experiments.update_app),
                      ("config", experiments.config_app), ("algo", algorithms.algo_app),
                      ("tensorboard", watching.tensorboard_app), ("server", server.server_app),
                      ("platform", platform_clean.platform_app), ("webui", watching.webui_app),
                      ("package", algorithms.package_app),
                      ("trainingservice", training_services.training_service_app),
                      ("jupyter-extension", watching.jupyter_app)):
    app.add_typer(_group, name=_name)


def _summaries_on_one_line(group: typer.Typer) -> None:
    """Give each command of ``group`` and its sub-groups, where it has none, a short help: its
    docstring's first paragraph as one line. A command list keeps the docstring's line breaks
    otherwise (typer's rich mode does), which leaves ragged lines mid-sentence."""
    for info in group.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback is not None else None)
        if info.short_help is None and doc:
            info.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _summaries_on_one_line(sub.typer_instance)


_summaries_on_one_line(app)

_default_show_warning = warnings.showwarning
_WARNED: set[str] = set()


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", "-v", callback=_version, is_eager=True,
                                                   help="print trialflow's version")] = False) -> None:
    """Hyperparameter-tuning experiments on Prefect (NNI-compatible)."""


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """Config warnings as one line, each once (the config may be read twice: by the command and its run);
    others as Python prints them."""
    from ..server.kept_server import OpenServerWarning

    if issubclass(category, _config.ConfigWarning | OpenServerWarning):
        if str(message) in _WARNED:
            return
        _WARNED.add(str(message))
        console.print(f"[yellow]warning:[/] {escape(str(message))}", markup=True, highlight=False, soft_wrap=True)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


def main() -> None:
    """Console entry point: one-line errors, exit code 1."""
    from ..server.api_choice import set_process_defaults

    warnings.showwarning = _show_warning
    set_process_defaults()
    no_collection_at_exit()
    try:
        code = app(standalone_mode=False)
    except UserError as exc:  # CliError and every domain error a user can fix: one line, exit 1
        console.print(f"[red]error:[/] {escape(str(exc))}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:
        if (full := no_space(exc)) is not None:  # any command on a full disk: one line too
            console.print(f"[red]error:[/] no space left on the device ({escape(str(full))}): free space, then run "
                          "the command again", markup=True, highlight=False, soft_wrap=True)
            sys.exit(1)
        if not (hasattr(exc, "show") and hasattr(exc, "exit_code")):
            raise
        exc.show()  # bad usage (click's exception, vendored by typer): its own message
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
