"""A trial's output on its way to Prefect's logs: bounded whatever the trial prints, readable lines."""

from __future__ import annotations

import logging
import time

import pytest

from trialflow.platforms import TrialHandle, trial_output
from trialflow.platforms.trial_output import MAX_BYTES, MAX_LINE_CHARS, OutputBudget, TrialOutput
from trialflow.platforms.trialfs import READ_CHUNK


class _Printing:
    """A service whose trial prints ``chunks`` to stdout, one per read."""

    output_read_seconds = 0.0

    def __init__(self, chunks):
        self.chunks = iter(chunks)

    def read_output(self, handle, offsets):
        return {"trial.stdout": next(self.chunks, b"")}


@pytest.fixture
def lines(monkeypatch):
    """What reaches the output logger (Prefect's API in a run), as text."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger(trial_output.LOGGER)
    monkeypatch.setattr(logger, "handlers", [Collect()])
    monkeypatch.setattr(logger, "propagate", False)
    logger.setLevel(logging.INFO)
    return records


def _follow(chunks, budget=None, reads=None):
    output = TrialOutput(_Printing(chunks), TrialHandle("Out01", "local", {}), budget)
    for _ in range(reads or len(chunks)):
        output.pump()
    output.pump(final=True)
    return output


def test_output_without_newlines_is_held_bounded_and_read_no_further_past_the_bound(lines):
    """200 MiB of a progress bar or binary without a newline: the controller held all of it, re-copied
    on every read (4.5 s of CPU, 526 MiB)."""
    started = time.process_time()
    output = _follow([b"x" * READ_CHUNK] * 50)
    assert time.process_time() - started < 2 and not output.partial
    assert output.bytes == MAX_BYTES and output.full
    assert lines[0] == "[stdout] " + "x" * MAX_LINE_CHARS + " [cut]"
    assert lines[-1].startswith("[trial output] more output than") and len(lines) == 2


def test_progress_bars_and_colours_reach_the_log_as_a_terminal_shows_them(lines):
    _follow([b"\x1b[32m 10%\r 50%\r100%\x1b[0m\r\n", b"done\r\n", b"\x07bell\x1b]0;title\x07 and\ttab\n"])
    assert lines == ["[stdout] 100%", "[stdout] done", "[stdout] bell and\ttab"]


def test_the_experiments_trials_share_one_budget_of_output(lines):
    budget = OutputBudget(total=3000)
    _follow([b"a\n" * 1000], budget)
    assert len(lines) == 1000
    _follow([b"b\n" * 1000], budget)
    assert lines[-1].startswith("[trial output] the experiment's trials sent 2 KB") and len(lines) == 1501


def test_a_read_of_many_lines_past_the_bound_still_sends_the_lines_before_it(lines):
    _follow([b"".join(b"%06d\n" % i for i in range(200_000))])  # 1.4 MB in one read
    assert len(lines) == 2001 and lines[0] == "[stdout] 000000" and lines[1999] == "[stdout] 001999"


def test_a_trial_stopped_on_purpose_is_not_reported_as_a_warning_or_an_error(monkeypatch):
    """An early stop's KeyboardInterrupt traceback and Prefect's "Finished in state EarlyStopped" line
    read as a crash (WARNING, ERROR) for an intended stop."""
    levels: list[tuple[int, str]] = []

    class Collect(logging.Handler):
        def emit(self, record):
            levels.append((record.levelno, record.getMessage()))

    class Stderr(_Printing):
        def read_output(self, handle, offsets):
            return {"trial.stderr": next(self.chunks, b"")}

    logger = logging.getLogger(trial_output.LOGGER)
    monkeypatch.setattr(logger, "handlers", [Collect()])
    monkeypatch.setattr(logger, "propagate", False)
    logger.setLevel(logging.INFO)  # as the output logger is set up in a run
    output = TrialOutput(Stderr([b"a warning of its own\n", b"KeyboardInterrupt\n"]),
                         TrialHandle("Out02", "local", {}))
    output.pump()
    output.stopped = True  # as the follower sets it before the stop
    output.pump()
    assert levels == [(logging.WARNING, "[stderr] a warning of its own"), (logging.INFO, "[stderr] KeyboardInterrupt")]
    for message, level in (("Finished in state EarlyStopped('stopped early')", logging.INFO),
                           ("Finished in state Cancelled('USER_CANCELED: cancelled')", logging.INFO),
                           ("Finished in state Failed('exit code 1')", logging.ERROR)):
        record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, message, None, None)
        record.task_run_name = "trial-Out02"
        trial_output._readable_failures(record)
        assert record.levelno == level, message
