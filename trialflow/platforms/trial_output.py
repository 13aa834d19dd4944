"""A trial's output in its ``trial-<id>`` task run's logs: what its command prints to stdout and stderr,
line by line, read from the platform as the trial runs (the files stay the full record).

Bounded: at most ``MAX_LINES`` lines and ``MAX_BYTES`` read per trial (a line without its newline
counts as it arrives: ``\r`` progress bars and binary output are held at most ``MAX_LINE_BYTES``, the
rest of that line dropped), at most ``EXPERIMENT_BYTES`` for all of an experiment's trials together
(:class:`OutputBudget`), each line cut at ``MAX_LINE_CHARS`` and stripped of terminal control
sequences, read at most every ``service.output_read_seconds``; past a bound one line says where the
rest is.
The lines go to Prefect's API only (not the controller's log or terminal), from the task run's context.
The trial's parameters and a failure's message (real line breaks) go the same way.

Lifecycle: a :class:`TrialOutput` per followed trial; :meth:`TrialOutput.pump` on each poll, and once
with ``final=True`` at the trial's end (the last, unterminated line too). Never raises: output that
cannot be read is tried again at the next pump, and logged at the end.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from ..trial.protocol import STDERR_FILE
from ..trial.records import is_metric_line
from . import TrainingService, TrialHandle

MAX_LINES = 2000
MAX_BYTES = 512 * 1024
MAX_LINE_CHARS = 2000
MAX_LINE_BYTES = 4 * MAX_LINE_CHARS  # held of a line whose newline has not come (UTF-8: 4 bytes a char at most)
EXPERIMENT_BYTES = 64 * 1024 * 1024  # sent to Prefect for all of an experiment's trials: 10,000 trials
# at MAX_BYTES each would put 5 GB into the server's database
# terminal control: CSI (colours, cursor), OSC (window titles), other escapes, C0 controls but \t
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]"
                     r"|[\x00-\x08\x0b-\x1f\x7f]")


class OutputBudget:
    """What an experiment's trials may still send to Prefect's logs, in bytes; shared by its trials'
    :class:`TrialOutput` (any thread)."""

    def __init__(self, total: int = EXPERIMENT_BYTES) -> None:
        self.total = self.left = total
        self._lock = threading.Lock()

    def take(self, size: int) -> int:
        """Take up to ``size`` bytes; returns how many were granted."""
        with self._lock:
            granted = min(size, self.left)
            self.left -= granted
            return granted
LOGGER = "trialflow.trial_output"
log = logging.getLogger("trialflow.trials")


INTENDED_ENDS = ("Finished in state EarlyStopped(", "Finished in state Cancelled(")


def output_logger() -> logging.Logger:
    """The logger whose records reach Prefect's API only, in the current task run's logs (set up once,
    with the filter below on Prefect's task-run logger)."""
    logger = logging.getLogger(LOGGER)
    if not logger.handlers:
        from prefect.logging.handlers import APILogHandler

        logger.addHandler(APILogHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False  # not the experiment's log file, not the terminal
        logging.getLogger("prefect.task_runs").addFilter(_readable_failures)
    return logger


def _readable_failures(record: logging.LogRecord) -> bool:
    """Prefect logs a task that returned a Failed state with ``exc_info=True`` and no exception: a stray
    ``NoneType: None`` line. For a trial it also quotes the message with its line breaks escaped, which
    the trial's own error line (above) already says readably: that record is dropped. A trial stopped on
    purpose (EarlyStopped, Cancelled) ends as intended: Prefect's ERROR for it becomes INFO."""
    if record.exc_info is not None and record.exc_info[0] is None:
        record.exc_info = None
    name = str(getattr(record, "task_run_name", "") or "")
    if not name.startswith("trial-"):
        return True
    message = record.getMessage()
    if message.startswith(INTENDED_ENDS) and record.levelno > logging.INFO:
        record.levelno, record.levelname = logging.INFO, "INFO"
    return not message.startswith("Task run failed with state:")


class TrialOutput:
    """Follows one trial's output (see the module doc)."""

    def __init__(self, service: TrainingService, handle: TrialHandle, budget: OutputBudget | None = None) -> None:
        self.service = service
        self.handle = handle
        self.budget = budget or OutputBudget()
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.dropping: set[str] = set()  # streams whose current line was cut: the rest of it is dropped
        self.lines = 0
        self.bytes = 0
        self.next_read = 0.0
        self.full = False
        self.error: Exception | None = None
        # set when trialflow stops the trial (an early stop, a kill): the KeyboardInterrupt traceback it
        # prints is what a stop looks like, not a warning
        self.stopped = False

    def pump(self, final: bool = False) -> None:
        if self.full or (not final and time.monotonic() < self.next_read):
            return
        self.next_read = time.monotonic() + self.service.output_read_seconds
        try:
            chunks = self.service.read_output(self.handle, self.offsets)
            self.error = None
        except Exception as exc:  # noqa: BLE001 -- the output is a convenience; the trial goes on
            self.error = exc
            if final:
                log.debug("trial %s: could not read its output: %s", self.handle.trial_id, exc)
            return
        logger = output_logger()
        for name, data in chunks.items():
            self.offsets[name] = self.offsets.get(name, 0) + len(data)
            room = self.budget.take(min(len(data), MAX_BYTES - self.bytes))
            over, data = room < len(data), data[:room]
            self.bytes += len(data)
            lines = (self.partial.pop(name, b"") + data).split(b"\n")
            if name in self.dropping:  # the tail of a line already cut
                lines.pop(0)
                if lines:
                    self.dropping.discard(name)
            rest = lines.pop() if lines else b""
            if final and rest:
                lines.append(rest)
            elif len(rest) > MAX_LINE_BYTES:
                lines.append(rest[:MAX_LINE_BYTES])
                self.dropping.add(name)
            elif rest:
                self.partial[name] = rest
            self._emit(logger, name, lines)
            if over and not self.full:
                self._stop(logger)
            if self.full:
                return

    def _emit(self, logger: logging.Logger, name: str, lines: list[bytes]) -> None:
        level = logging.WARNING if name == STDERR_FILE and not self.stopped else logging.INFO
        stream = "stderr" if name == STDERR_FILE else "stdout"
        for raw in lines:
            if is_metric_line(raw):  # a result in NNI's stdout framing: recorded as a result, not shown
                continue
            if self.lines >= MAX_LINES:
                self._stop(logger)
                return
            # a progress bar rewrites its line after each \r: what a terminal would show is the last one
            line = CONTROL.sub("", raw.decode("utf-8", "replace").rstrip("\r").rsplit("\r", 1)[-1])
            if len(line) > MAX_LINE_CHARS or len(raw) >= MAX_LINE_BYTES:
                line = line[:MAX_LINE_CHARS] + " [cut]"
            self.lines += 1
            logger.log(level, "[%s] %s", stream, line)

    def _stop(self, logger: logging.Logger) -> None:
        """Past a bound: one line says where the rest is, and the output is no longer read."""
        if self.budget.left == 0 and self.bytes < MAX_BYTES and self.lines < MAX_LINES:
            logger.info("[trial output] the experiment's trials sent %d KB of output, all its logs take: the rest "
                        "of each is in its files (trialflow log trial %s)", self.budget.total // 1024,
                        self.handle.trial_id)
        else:
            logger.info("[trial output] more output than %d lines or %d KB: the rest is in the trial's files "
                        "(trialflow log trial %s)", MAX_LINES, MAX_BYTES // 1024, self.handle.trial_id)
        self.full = True
        self.partial.clear()
