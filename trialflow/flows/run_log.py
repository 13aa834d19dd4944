"""The experiment's log while its flow runs: :func:`controller_log` sends the run's log records
(trialflow's own, and Prefect's flow and task runs') to the experiment's ``log/`` file at INFO, as
Prefect's API gets them, while a terminal keeps the level the user set.

Lifecycle: a context manager around the run; on leaving it every handler, filter and level it changed
is restored and the file closed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..experiments import CONTROLLER_LOG
from ..records.disk_space import SpaceTolerantFileHandler

# The loggers whose records go to the experiment's log: trialflow's own and the run's flow/task runs.
LOGGED = ("trialflow", "prefect.flow_runs", "prefect.task_runs")


class _RunFormatter(logging.Formatter):
    """Names a record's task run or flow run (Prefect puts them on the record) or else its logger."""

    def format(self, record: logging.LogRecord) -> str:
        record.source = (getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
                         or record.name)
        return super().format(record)


class _TerminalLevel(logging.Filter):
    """Keeps a terminal handler at the level the run's loggers had before :func:`controller_log` lowered
    them to INFO for the experiment's log: ``PREFECT_LOGGING_LEVEL=WARNING`` still means no INFO lines
    in the terminal (three a trial, "Finished in state ...", formatted by Rich). ``levels``: logger name
    -> the level it had; records of other loggers pass."""

    def __init__(self, levels: dict[str, int]) -> None:
        super().__init__()
        self.levels = levels

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        while name:
            if name in self.levels:
                return record.levelno >= self.levels[name]
            name = name.rpartition(".")[0]
        return True


def _terminal_handlers(loggers: list[logging.Logger]) -> list[logging.Handler]:
    """The stream handlers (not files, so not the experiment's log) that records of ``loggers`` reach
    by propagation."""
    found: dict[int, logging.Handler] = {}
    for logger in loggers:
        current: logging.Logger | None = logger
        while current is not None:
            for handler in current.handlers:
                if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                    found[id(handler)] = handler
            current = current.parent if current.propagate else None
    return list(found.values())


@contextmanager
def controller_log(exp_dir: Path) -> Iterator[None]:
    """Send the run's log records to the experiment's log file while it runs (the background launcher's
    raw output goes elsewhere, so nothing is written twice). The file and Prefect's API get INFO; the
    terminal keeps the level the user set."""
    path = exp_dir / CONTROLLER_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = SpaceTolerantFileHandler(path, encoding="utf-8")
    handler.setFormatter(_RunFormatter("[%(asctime)s] %(levelname)s (%(source)s) %(message)s"))
    loggers = [logging.getLogger(name) for name in LOGGED]
    levels = [logger.level for logger in loggers]
    lowered = {logger.name: level for logger in loggers
               if (level := logger.getEffectiveLevel()) > logging.INFO}  # e.g. PREFECT_LOGGING_LEVEL=WARNING
    terminal = _TerminalLevel(lowered)
    terminals = _terminal_handlers(loggers) if lowered else []
    for logger in loggers:
        logger.addHandler(handler)
        if logger.name in lowered:
            logger.setLevel(logging.INFO)
    for stream in terminals:
        stream.addFilter(terminal)
    try:
        yield
    finally:
        for stream in terminals:
            stream.removeFilter(terminal)
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
        handler.close()
