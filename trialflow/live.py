"""Foreground runs of the CLI: the experiment flow in this process with a live progress display
(trials done / budget, best so far, running trials), refreshed from the store once a second."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from .experiments import open_store
from .results import best_trial, maximizes, outcome_line, trial_value


def _render(root: Path, experiment_id: str, maximize: bool) -> Table:
    store = open_store(root, experiment_id)
    try:
        record, trials = store.experiment(), store.trials()
    finally:
        store.close()
    budget = record.controls.get("max_trial_number", record.config.get("maxTrialNumber"))
    done = sum(t.is_terminal for t in trials)
    best = best_trial(trials, maximize)
    table = Table(title=f"experiment {experiment_id} - {record.status}", show_header=False)
    table.add_row("trials done", f"{done}" + (f" / {budget}" if budget else ""))
    table.add_row("best so far", "-" if best is None else f"{trial_value(best)} ({best.id}) {best.parameters}")
    running = [t for t in trials if t.status in ("RUNNING", "WAITING")]
    table.add_row("running", ", ".join(f"{t.id}#{t.sequence}" for t in running[:12]) or "-")
    return table


def _outside_runs(record: logging.LogRecord) -> bool:
    return not record.name.startswith(("prefect.flow_runs", "prefect.task_runs"))


def run_with_progress(experiment_id: str, root: Path, config_path: str | None, console: Console
                      ) -> tuple[str, str | None]:
    """Run the experiment here with its live table; (final status, the run's failure message when no
    trial succeeded, else None)."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from .flows.experiment import experiment_flow, final_status

    # The live table shows each trial's end and the CLI prints one line when the run fails: Prefect's
    # own flow/task-run logs (tracebacks, one per failed trial) would only bury them in the terminal.
    # They are kept from the terminal's handlers only: the experiment's log file still gets them.
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.addFilter(_outside_runs)

    store = open_store(root, experiment_id)
    maximize = maximizes(store.experiment())
    store.close()
    done = threading.Event()
    with Live(_render(root, experiment_id, maximize), console=console, refresh_per_second=2,
              transient=False) as live:
        def refresh() -> None:
            while not done.wait(1.0):
                live.update(_render(root, experiment_id, maximize))

        thread = threading.Thread(target=refresh, daemon=True)
        thread.start()
        try:
            state = experiment_flow(config_path, experiment_id, str(root), return_state=True)
            status = final_status(state)
        finally:
            done.set()
            thread.join()
            live.update(_render(root, experiment_id, maximize))
    store = open_store(root, experiment_id)
    trials = store.trials()
    store.close()
    best = best_trial(trials, maximize)
    console.print()
    console.print(outcome_line(trials), highlight=False)
    if best is not None:
        console.print(f"best trial {best.id} (#{best.sequence}): value {trial_value(best)}, "
                      f"parameters {best.parameters}")
    return status, state.message if state.is_failed() else None
