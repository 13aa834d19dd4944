"""The ``trialflow`` console script: for a command about to run an experiment it starts the kept
Prefect server (when none runs) and, for a background run, the controller that will run it, before the
CLI's own imports; then it hands over to :func:`trialflow.cli.main`.

The server's start-up is the longest step of a cold ``trialflow create`` and the controller's imports
the longest of a warm one; begun before the CLI imports Typer and Rich, each ends sooner. Standard
library only until the hand-over.
"""

from __future__ import annotations

import sys

from .server.api_choice import set_process_defaults

# commands that run an experiment in this process or in a controller it starts
RUNNING_COMMANDS = frozenset({"create", "resume"})
HELP_FLAGS = frozenset({"--help", "-h"})
FOREGROUND_FLAGS = frozenset({"--foreground", "-f"})
# the server's port and UI path (nnictl's --port, --url_prefix): the command starts it (and then its
# controller) itself, to tell the user when the server runs with others
SERVER_FLAGS = ("--port", "-p", "--url_prefix", "--url-prefix", "-u")


def runs_an_experiment(args: list[str]) -> bool:
    """Whether the command line ``args`` (without the program) is a command that runs an experiment."""
    return bool(args) and args[0] in RUNNING_COMMANDS and not HELP_FLAGS.intersection(args)


def chooses_the_server(args: list[str]) -> bool:
    """Whether ``args`` give the kept server's port or UI path (``--port N``, ``--port=N``, ``-p N``,
    ``-pN``, and the same of ``--url_prefix``/``-u``)."""
    return any(a in SERVER_FLAGS or a.startswith(tuple(f + ("=" if f.startswith("--") else "") for f in SERVER_FLAGS))
               for a in args)


def main() -> None:
    """Console entry point. A server or controller that cannot start is left for the command to meet
    and report; a controller the command does not take ends by itself. A Ctrl-C before the command has
    begun (while it imports) ends it as one inside a command does: an empty line, exit code 1, no
    traceback."""
    try:
        _start()
    except KeyboardInterrupt:
        print(file=sys.stderr)
        sys.exit(1)


def _start() -> None:
    set_process_defaults()
    args = sys.argv[1:]
    if runs_an_experiment(args) and not chooses_the_server(args):
        from .app.spare_controller import start_controller_early
        from .server.api_choice import point_this_process_at_kept_server
        from .server.kept_server import ServerError

        try:
            point_this_process_at_kept_server()
            if not FOREGROUND_FLAGS.intersection(args):
                start_controller_early()
        except (ServerError, OSError):
            pass
    from .cli import main as cli_main

    cli_main()
