"""Background controllers started before their experiment exists, so that their start-up (importing
Prefect and the task library, their longest step) overlaps the CLI's checking of the config.

Lifecycle: :func:`start_controller` starts ``python -m trialflow.app.controller_launch`` in a process group
of its own (a Ctrl-C or hang-up of the terminal never reaches it), in the command's session. It points
itself at the kept Prefect server, then imports what a run needs while a thread reads one line from its
stdin: the experiment to run.
:meth:`PendingController.run` sends it; :meth:`PendingController.cancel` (a refused config) closes stdin
instead, and the process ends at once, mid-import if need be, without doing anything. Until it has an
experiment its output goes to a spool file; then it moves it to the experiment's ``log/controller.out``
and writes there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..foundation.user_errors import UserError
from ..trial.procs import pid_alive

if TYPE_CHECKING:
    from ..server.kept_server import ServerError

CONTROLLER_OUTPUT = "controller.out"  # in the experiment's log/ folder: a background controller's raw output


class PendingController:
    """A started controller waiting for its experiment: a new process, whose stdin carries the job line,
    or a claimed spare (:mod:`trialflow.app.spare_controller`), whose connection carries it."""

    def __init__(self, pid: int, spool: Path, channel: IO[bytes], proc: subprocess.Popen[bytes] | None = None,
                 start_time: int | None = None) -> None:
        self._pid = pid
        self.spool = spool  # its output until it has an experiment
        self._channel = channel
        self._proc = proc
        self._start_time = start_time

    @property
    def pid(self) -> int:
        return self._pid

    def ended(self) -> bool:
        """Whether its process has exited."""
        if self._proc is not None:
            return self._proc.poll() is not None
        return not pid_alive(self._pid, self._start_time)

    def run(self, experiment_id: str, root: Path, config_path: str | None) -> None:
        """Have it run (or resume) ``experiment_id`` under ``root``."""
        job = {"experiment_id": experiment_id, "root": str(root), "config": config_path}
        self._send(json.dumps(job) + "\n")

    def cancel(self) -> None:
        """It ends without running anything (idempotent)."""
        self._send("")

    def _send(self, line: str) -> None:
        if self._channel.closed:
            return
        try:
            self._channel.write(line.encode())
            self._channel.close()
        except OSError:  # it died while starting (a broken pipe or a reset): its spool (then its log) says why
            pass


def start_controller() -> PendingController:
    """Start a controller process that waits for its experiment (see the module doc). Raises OSError
    when it cannot start."""
    fd, spool = tempfile.mkstemp(prefix="trialflow-controller-", suffix=".out")
    try:
        # a process group of its own (a Ctrl-C or hang-up of the terminal never reaches it) in the command's
        # session: the scheduler shares the CPU between sessions first (autogroups), so while the command
        # and this controller start, a kept server starting beside them keeps a CPU to itself
        proc = subprocess.Popen([sys.executable, "-m", "trialflow.app.controller_launch"], stdin=subprocess.PIPE,
                                stdout=fd, stderr=fd, close_fds=True, process_group=0)
    finally:
        os.close(fd)
    assert proc.stdin is not None
    return PendingController(proc.pid, Path(spool), proc.stdin, proc=proc)


def _move_output(spool: Path, log_path: Path) -> None:
    """From now on this process's stdout/stderr append to ``log_path``, after what the spool holds."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.write(fd, spool.read_bytes())
    except OSError:
        pass
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    spool.unlink(missing_ok=True)


def _await_job(spool: Path) -> threading.Thread:
    """Read the job line in a thread (joined before ``_JOB`` is read). When stdin closes without one
    (the config was refused) the process exits there and then, leaving nothing behind: on a busy machine
    its imports may take longer than the person's next command."""
    def read() -> None:
        line = sys.stdin.readline()
        if not line.strip():
            spool.unlink(missing_ok=True)
            os._exit(0)
        _JOB.append(line)

    reader = threading.Thread(target=read, name="job-line", daemon=True)
    reader.start()
    return reader


_JOB: list[str] = []  # the job line, once read


def _main() -> int:
    from ..foundation.startup_gc import no_collection_at_exit

    no_collection_at_exit()
    spool = Path(os.readlink("/proc/self/fd/1"))
    from ..server.api_choice import point_this_process_at_kept_server
    from ..server.kept_server import ServerError

    try:
        point_this_process_at_kept_server()  # starting while the imports below run
        problem = None
    except ServerError as exc:
        problem = exc
    reader = _await_job(spool)  # after the server's start: a refused config never interrupts that
    from ..foundation.startup_gc import long_lived_imports

    with long_lived_imports():
        from ..flows import experiment  # noqa: F401 -- imported while `create` checks the config

    reader.join()
    return run_job(json.loads(_JOB[0]), spool, problem)


def run_job(job: dict[str, Any], spool: Path, problem: ServerError | None = None) -> int:
    """Run the job a command sent (its experiment, under its root) in this process, its output moved
    from ``spool`` to the experiment's log; ``problem``: why no Prefect API can be reached (recorded,
    nothing run). Returns the process's exit code."""
    from ..experiments import CONTROLLER_LOG
    from ..flows import experiment
    from ..server.kept_server import ServerError

    root = Path(job["root"])
    _move_output(spool, root / job["experiment_id"] / Path(CONTROLLER_LOG).parent / CONTROLLER_OUTPUT)
    if problem is not None:  # recorded: `create` reports the experiment's message
        print(problem, file=sys.stderr)
        experiment.record_unstarted_run(job["experiment_id"], problem, root)
        return 1
    from ..flows.api_outage import exit_now_if_api_gone
    from ..records.disk_space import NoSpaceLeft

    try:
        code = run_to_exit_code(job["experiment_id"], root, job["config"])
    except (ServerError, NoSpaceLeft) as exc:  # recorded already (as far as space allowed), in one line
        print(exc, file=sys.stderr)
        return 1
    except Exception as exc:  # e.g. the run's final state could not reach an API gone meanwhile
        exit_now_if_api_gone(1, traceback.format_exc(), ended_by=exc)
        raise
    exit_now_if_api_gone(code)
    return code


def run_to_exit_code(experiment_id: str, root: Path, config_path: str | None) -> int:
    """Run (or resume) the stored experiment in this process; 1 when its run Failed (no trial
    succeeded: cron and automations see a non-zero exit), else 0. Raises what ended a run that could
    not go on."""
    from ..foundation.startup_gc import long_lived_imports

    with long_lived_imports():
        from ..flows.experiment import final_status, run_experiment_flow
    state = run_experiment_flow(config_path, experiment_id, str(root))
    final_status(state, experiment_id, root)
    return 1 if state.is_failed() else 0


RUN_PAGE_WAIT = 60.0  # how long `create` waits for its run's page (a slow platform's set-up comes after it)


class ControllerEndedEarly(UserError):
    """A background controller ended before its experiment's flow run began."""


def wait_for_run_page(controller: PendingController, experiment_id: str, root: Path,
                      earlier_run: str | None) -> tuple[str, bool]:
    """The Prefect UI page of the flow run that ``controller`` (running the experiment) began, once it
    has recorded it (as nnictl prints its web UI's address): a run other than ``earlier_run``, the one a
    resumed experiment had; and whether that is on the kept server. After :data:`RUN_PAGE_WAIT` a line
    saying how to ask for it later. Raises :class:`ControllerEndedEarly` (naming what the controller
    recorded or where its output is) when the controller ends before that."""
    import time

    from ..experiments import CONTROLLER_LOG, open_store
    from ..server.prefect_ui_pages import flow_run_page, sign_in_note

    store = open_store(root, experiment_id)
    deadline = time.monotonic() + RUN_PAGE_WAIT
    try:
        while time.monotonic() < deadline:
            record = store.experiment()
            if record.flow_run_id and record.flow_run_id != earlier_run:
                page = flow_run_page(record.prefect_api, record.flow_run_id)
                note = sign_in_note(record.prefect_api)  # only the kept server has one
                return (page + note, bool(note)) if page else (
                    "none (Prefect's temporary server has no UI: unset TRIALFLOW_PREFECT_SERVER)", False)
            if controller.ended():
                log = root / experiment_id / Path(CONTROLLER_LOG).parent / CONTROLLER_OUTPUT
                why = record.message or f"see {log if log.exists() else controller.spool}"
                raise ControllerEndedEarly(f"experiment {experiment_id} ended at once ({record.status}): {why}")
            time.sleep(0.05)
    finally:
        store.close()
    return f"not known yet: trialflow webui url {experiment_id}", False


if __name__ == "__main__":
    sys.exit(_main())
