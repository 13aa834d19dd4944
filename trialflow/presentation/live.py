"""Foreground runs of the CLI: the experiment flow in this process with a live progress display
(trials done / budget, best so far, running trials), refreshed from the store once a second.

Ctrl-C (or SIGTERM): the first asks the experiment to stop (its running trials are cancelled,
USER_CANCELED, and the run ends STOPPED within a loop tick plus the trials' kill grace); a second one
quits at once with exit code 128 + the signal (130 for Ctrl-C), leaving the experiment to
``trialflow resume`` (its trials are re-attached)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..experiments import open_store
from ..experiments.results import (
    best_trial,
    maximizes,
    multi_objective,
    outcome_line,
    pareto_lines,
    pareto_set,
    trial_value,
)
from ..flows.run_control import clear_interrupt, interrupt, interrupted
from ..foundation.startup_gc import long_lived_imports
from ..foundation.status import TrialStatus
from ..records.changed_trials import KeptTrials
from ..records.store import Control, ExperimentRecord, TrialRecord
from ..server.prefect_ui_pages import flow_run_page, sign_in_note

# This process runs the experiment, so it wrote every time the view compares: a clock step is all it covers.
LIVE_CLOCK_SLACK = 5.0
log = logging.getLogger("trialflow.live")


class _LiveView:
    """What the live table shows, from one store kept open for the run: each refresh reads the
    experiment's record and only the trials that changed since the last (:class:`KeptTrials`), so a
    refresh costs the same at 10 trials and at 10,000.

    Lifecycle: made before the run, :meth:`close` after it; one thread at a time uses it (the refresh
    thread, then the caller once that thread is joined)."""

    def __init__(self, root: Path, experiment_id: str, slack: float = LIVE_CLOCK_SLACK) -> None:
        self.root, self.experiment_id = root, experiment_id
        self.store = open_store(root, experiment_id)
        self.maximize = maximizes(self.store.experiment())
        self._kept = KeptTrials(self.store, slack)

    def close(self) -> None:
        self.store.close()

    def run_page(self) -> str | None:
        """The Prefect UI page of the experiment's run, once its controller has recorded it."""
        record = self.store.experiment()
        page = flow_run_page(record.prefect_api, record.flow_run_id)
        return page + sign_in_note(record.prefect_api) if page else None

    def table(self, reread: bool = False) -> Table:
        """The table as the store has it now; ``reread``: from every trial read afresh (the last one)."""
        record = self.store.experiment()
        return _table(self.experiment_id, record, self._kept.read(everything=reread), self.maximize)

    @property
    def trials(self) -> list[TrialRecord]:
        """The trials as the last :meth:`table` read them, by sequence."""
        return self._kept.trials


def _table(experiment_id: str, record: ExperimentRecord, trials: list[TrialRecord], maximize: bool) -> Table:
    budget = record.controls.get(Control.MAX_TRIAL_NUMBER, record.config.get("maxTrialNumber"))
    done = sum(t.is_terminal for t in trials)
    objectives = multi_objective(record)
    best = None if objectives is not None else best_trial(trials, maximize)
    stopping = interrupted() is not None and not record.end_time
    status = "STOPPING (Ctrl-C again quits at once)" if stopping else record.status
    title = f"experiment {experiment_id} - {status}"
    table = Table(title=title, show_header=False, min_width=len(title) + 2)
    table.add_column()
    table.add_column(overflow="fold")  # the UI address stays whole, over lines when it must
    table.add_row("trials done", f"{done}" + (f" / {budget}" if budget else ""))
    if objectives is not None:
        front = pareto_set(trials, objectives)
        table.add_row("Pareto set so far", f"{len(front)}: " + ", ".join(t.id for t in front[:12]) if front else "-")
    else:
        table.add_row("best so far", "-" if best is None else f"{trial_value(best)} ({best.id}) {best.parameters}")
    running = [t for t in trials if t.status in (TrialStatus.RUNNING, TrialStatus.WAITING)]
    table.add_row("running", ", ".join(f"{t.id}#{t.sequence}" for t in running[:12]) or "-")
    page = flow_run_page(record.prefect_api, record.flow_run_id)
    if page:
        table.add_row("Prefect UI", page)
    elif not record.flow_run_id and not record.end_time:
        table.add_row("starting", STARTING)
    return table


STARTING = "its Prefect flow run (a Prefect server's first start takes up to a minute)"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a terminal's Ctrl-C, a `kill`


def _for_the_terminal(record: logging.LogRecord) -> bool:
    """trialflow's own warnings and errors, and anything critical."""
    return record.levelno >= logging.CRITICAL or (record.levelno >= logging.WARNING
                                                  and record.name.startswith("trialflow"))


def keep_prefect_chatter_off_the_terminal() -> None:
    """Filter every terminal handler of the logging tree (the root's, and those of loggers that do not
    pass records up to it, such as Prefect's ``prefect._internal``) with :func:`_for_the_terminal`,
    until this process ends; file handlers are left as they are. Handlers' own failures are no longer
    printed either (``logging.raiseExceptions``), which is what keeps Prefect's log shipper from writing
    "--- Error logging to API ---" to stderr for each batch an absent API did not take.

    Why: the live table shows each trial's end and the CLI prints one line when the run fails. Prefect's
    flow/task-run logs (tracebacks, one per failed trial) and its own chatter (the temporary server's
    start and stop, retries of a stopping API, its events worker's errors when the API is gone, each
    with a whole event) would only bury them. The experiment's log file still gets the run's records,
    and trialflow's own warning there says that the API failed."""
    logging.raiseExceptions = False
    for _, handler in _terminal_handlers():
        handler.addFilter(_for_the_terminal)  # once: addFilter skips a filter the handler has


def _terminal_handlers() -> list[tuple[logging.Logger, logging.StreamHandler[Any]]]:
    """The handlers of the logging tree that write to a stream, not a file, with their loggers: the
    root's, and those of loggers that do not pass records up to it (a record reaches one of these)."""
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger) and not logger.propagate]
    return [(logger, handler) for logger in loggers for handler in logger.handlers
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)]


def _silenced(record: logging.LogRecord) -> bool:
    return False


class _AboveTheTable(logging.Handler):
    """Prints each record through a Rich console, whose live table it then lands above."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(Text(self.format(record)), soft_wrap=True)
        except Exception:  # noqa: BLE001 -- as logging's own handlers: reported by handleError
            self.handleError(record)


@contextmanager
def logs_above_the_table(console: Console) -> Iterator[None]:
    """While ``console`` shows a live table on a terminal: what the terminal handlers of the logging
    tree would print (:func:`_for_the_terminal`, once :func:`keep_prefect_chatter_off_the_terminal`
    ran) is printed through ``console``, above the table, in the root terminal handler's format, and
    those handlers print nothing; as they were on exit. A line written straight to the terminal would
    land after the table, where its next redraw erases it and leaves part of the old table above. Not
    on a terminal (a log file: the table is printed once, at the end), nothing changes."""
    if not console.is_terminal:
        yield
        return
    found = _terminal_handlers()
    loggers = list(dict.fromkeys(logger for logger, _ in found))
    handlers = list(dict.fromkeys(handler for _, handler in found))
    above = _AboveTheTable(console)
    above.addFilter(_for_the_terminal)
    above.setFormatter(next((h.formatter for h in handlers if h.formatter is not None), None))
    for handler in handlers:
        handler.addFilter(_silenced)
    for logger in loggers:
        logger.addHandler(above)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(above)
        for handler in handlers:
            handler.removeFilter(_silenced)


def _first_interrupt(experiment_id: str) -> Callable[[int, FrameType | None], None]:
    """The SIGINT/SIGTERM handler while the experiment runs: stop it; a second signal quits at once."""
    def second(signum: int, _frame: FrameType | None) -> None:
        os.write(sys.stderr.fileno(), f"\nquit; experiment {experiment_id} was left as it was: "
                 f"trialflow resume {experiment_id}\n".encode())
        os._exit(128 + signum)

    def first(signum: int, _frame: FrameType | None) -> None:
        interrupt(signum)
        for sig in STOP_SIGNALS:
            signal.signal(sig, second)

    return first


def run_with_progress(experiment_id: str, root: Path, config_path: str | None, console: Console
                      ) -> tuple[str, str | None]:
    """Run the experiment here with its live table; (final status, the run's failure message when no
    trial succeeded, else None). Raises what ended a run that could not go on; when that is a failed
    call to the Prefect API (its record then says how the experiment ended), after the outcome lines."""
    view = _LiveView(root, experiment_id)
    try:
        status, failure, failed_call = _run_shown(view, config_path, console)
        record, trials = view.store.experiment(), view.trials
    finally:
        view.close()
    best = best_trial(trials, view.maximize)
    console.print(outcome_line(trials), highlight=False)
    front = pareto_lines(record, trials)
    if front is not None:
        console.print("\n".join(front), highlight=False, markup=False)
    elif best is not None:
        console.print(f"best trial {best.id} (#{best.sequence}): value {trial_value(best)}, "
                      f"parameters {best.parameters}")
    if failed_call is not None:
        raise failed_call
    return status, failure


def _run_shown(view: _LiveView, config_path: str | None, console: Console) -> tuple[str, str | None, Exception | None]:
    """Run the flow here under the live table, refreshed once a second; (final status, the run's failure
    message when no trial succeeded, the failed call to the Prefect API that ended it, if one did).
    Raises what else ended a run that could not go on."""
    with long_lived_imports():
        from ..flows.api_outage import api_failure_line
        from ..flows.experiment import final_status, run_experiment_flow

    keep_prefect_chatter_off_the_terminal()  # after the imports: Prefect's handlers exist then
    experiment_id = view.experiment_id
    done = threading.Event()
    clear_interrupt()
    on_signal = _first_interrupt(experiment_id)
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    with Live(view.table(), console=console, refresh_per_second=2,
              transient=False) as live, logs_above_the_table(console):
        def refresh() -> None:
            told = console.is_terminal  # a log (cron, CI) sees the table at the end only: the page goes first
            while not done.wait(1.0):
                try:
                    if not told and (page := view.run_page()):
                        console.print(f"experiment {experiment_id}  Prefect UI: {page}", soft_wrap=True,
                                      highlight=False)
                        told = True
                    live.update(view.table())
                except Exception:  # noqa: BLE001 -- the table shows the last good read and tries again
                    log.debug("the live table could not be refreshed", exc_info=True)

        thread = threading.Thread(target=refresh, daemon=True)
        thread.start()
        status, failure, failed_call = "", None, None
        try:
            state = run_experiment_flow(config_path, experiment_id, str(view.root))
            status = final_status(state, experiment_id, view.root)
            failure = state.message if state.is_failed() else None
        except Exception as exc:
            if api_failure_line(exc) is None:
                raise
            failed_call = exc  # Prefect's copy of the run's end, or a call of its engine mid-run
        finally:
            for sig, old_handler in previous.items():
                signal.signal(sig, old_handler)
            done.set()
            thread.join()
            live.update(view.table(reread=True))
            live.stop()
            console.print()  # what follows (the outcome, or the CLI's error line) starts a line of its own
    return status, failure, failed_call
