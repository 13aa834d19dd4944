"""Shared fixtures: an isolated Prefect test server (one per run, shared by the xdist workers), isolated homes,
trial scripts, and the markers that say what a test starts (see :data:`SERVICE_MARKERS`)."""

from __future__ import annotations

import atexit
import contextvars
import gc
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")  # the emulators are on loopback, never behind a proxy
# One thread per numerical library (OpenBLAS, OpenMP, MKL) here and in every process the tests start: the
# tuners' small matrices gain nothing from a second thread, and with the cores busy a spinning BLAS thread
# multiplies the model-based tuners' CPU (docs/testing.md#parallel-workers).
for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")
# This process's Prefect home (Prefect reads it once, at import): never the user's, and never shared with
# another xdist worker (a temporary server's SQLite database there is this process's alone). Each test
# also gets its own (``isolated_home``), which the processes it starts use.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="trialflow-tests-prefect-")
atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)
# One cache for the whole run, its xdist workers together: the first Prefect server of the run keeps the
# migrated empty database that the next ones start from (trialflow.server.prefect_db_template), as a user's
# servers share theirs. The process that starts the run makes it (before its workers start, which inherit
# it) and removes it at its exit. Tests of the cache set their own.
RUN_CACHE = "TRIALFLOW_TESTS_RUN_CACHE"
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(RUN_CACHE):
    os.environ["TRIALFLOW_CACHE_DIR"] = os.environ[RUN_CACHE]
else:
    os.environ["TRIALFLOW_CACHE_DIR"] = os.environ[RUN_CACHE] = tempfile.mkdtemp(prefix="trialflow-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["TRIALFLOW_CACHE_DIR"], ignore_errors=True)

# A full pass of the cyclic collector after 100 middle ones instead of Python's 10 (it still waits until the
# long-lived objects grew by a quarter): a worker holds up to ~900,000 long-lived objects (Prefect, the
# suite, its in-process experiments' state) that every full pass walks, and those passes took three
# quarters of the tenth of a worker's CPU that went to the collector (docs/testing.md#parallel-workers).
# Garbage is still freed.
gc.set_threshold(*gc.get_threshold()[:2], 100)

PYTHON = sys.executable
# Trial commands say `python3`: this interpreter's own, not a version manager's shim found first on PATH
# (a shim is a shell script that costs each trial interpreter tens of milliseconds).
os.environ["PATH"] = os.pathsep.join([os.path.dirname(PYTHON), os.environ.get("PATH", "")])


# A test that runs a flow without the fixture below gets Prefect's temporary server, which dies with
# it; tests of the kept server ask for it (TRIALFLOW_PREFECT_SERVER=kept) in a home of their own.
os.environ.setdefault("TRIALFLOW_PREFECT_SERVER", "temporary")
# No spare controllers after a background create (each is a second controller's imports of CPU); the
# tests of spares turn them on.
os.environ.setdefault("TRIALFLOW_SPARE_CONTROLLER", "0")


SHARED_SERVER_HOME = "kept-server"  # under the run's base temp folder: the home of the run's kept server


def _shared_server_home(config) -> Path:
    """The home of the kept server every xdist worker of this run uses: in the run's base temp folder
    (the controller's; each worker's own is a folder in it), or this session's without xdist."""
    base = config._tmp_path_factory.getbasetemp()
    return (base.parent if _is_xdist_worker(config) else base) / SHARED_SERVER_HOME


@pytest.fixture(scope="session")
def prefect_server(request):
    """trialflow's kept local Prefect server, in a throwaway home, for tests that run flows: one for the
    whole run, which the xdist workers share (the first worker to ask starts it, the others find it
    running, as a user's second shell does: :func:`~trialflow.server.kept_server.ensure_server` holds
    the server folder's lock); yields its API URL, which is PREFECT_API_URL meanwhile (for this process
    and the CLI processes tests start). It stops at the run's end: at the xdist controller's session
    finish (:func:`pytest_sessionfinish`), or at this fixture's teardown without xdist, and when the
    process that runs the session is killed. Its tests find their own flow runs, events and artifacts
    by id or name: other workers' are on it too."""
    from prefect.settings import temporary_settings

    from trialflow.flows.run_api import kept_server_client
    from trialflow.server.kept_server import ensure_server, stop_server

    worker = _is_xdist_worker(request.config)
    home = _shared_server_home(request.config)
    home.mkdir(exist_ok=True)
    # a worker's parent is the xdist controller, whose run the server serves to its end
    owner = os.getppid() if worker else os.getpid()
    server = ensure_server(home, stop_with_pid=owner, port=0)  # 4200 stays free for the user's
    client = server.client_settings()  # its address and auth string
    previous = {name: os.environ.get(name) for name in client}
    os.environ.update(client)
    try:
        with temporary_settings(updates=kept_server_client(server)):  # as a controller's clients of it
            yield server.url
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _drain_prefect_events(logs=True)
        if not worker:
            stop_server(home)


# What a test starts, from the fixtures it uses: fixture -> marker. `pytest -m "not slurm"` runs without
# Slurm, `-m "not e2e"` is the quick loop (every test that starts a server, a cluster, a browser or a
# kernel, or runs an experiment, is e2e). Session-scoped services start once per xdist worker; those
# that cannot be shared cheaply are kept on one worker (:data:`ONE_WORKER`).
SERVICE_MARKERS = {
    "prefect_server": "prefect", "prefect_pool": "pool", "on_pool": "pool", "sshd_servers": "sshd",
    "known_hosts": "sshd", "slurm_cluster": "slurm", "postgres_server": "postgres", "chromium": "chromium",
    "jupyter_kernel": "jupyter", "k8s_emulator": "emulator", "openpai_emulator": "emulator",
    "dlts_emulator": "emulator", "dlc_emulator": "emulator", "aml_emulator": "emulator", "mlflow_server": "mlflow",
}
# a work pool's server and worker, a Slurm cluster, an MLflow server: one of each per run
ONE_WORKER = ("pool", "slurm", "mlflow")
# Each its own xdist group, so each starts once per run, and the two may run on different workers:
# together on one worker they were the suite's longest serial stretch (17 of its 28 minutes on a
# slower machine, the test timeline), longer than any other worker's share.


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks given here
def pytest_collection_modifyitems(config, items):
    """Marks each test by the services its fixtures start (:data:`SERVICE_MARKERS`), every such test
    and every test already marked ``e2e`` as ``e2e``, and keeps each :data:`ONE_WORKER` service's
    tests on one xdist worker (a group named after the service); channel-only variants of the
    job-platform contract run only the tests about channels (:meth:`JobPlatformContract.runs_on_variant`)."""
    from trialflow.testing.contract import JobPlatformContract

    kept, dropped = [], []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        services = {SERVICE_MARKERS[name] for name in fixtures if name in SERVICE_MARKERS}
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("store_url") == "postgresql":
            services.add("postgres")
        for name in sorted(services):
            item.add_marker(name)
        if services or item.get_closest_marker("e2e"):
            item.add_marker("e2e")
        for name in ONE_WORKER:
            if name in services:
                item.add_marker(pytest.mark.xdist_group(name))
                break
        cls = getattr(item, "cls", None)
        if (cls is not None and issubclass(cls, JobPlatformContract) and callspec is not None
                and not cls.runs_on_variant(item.originalname, callspec.id)):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test's own HOME, experiments home, config folder and Prefect home: nothing a test does
    reads or writes the user's, and nothing another test left is seen."""
    for variable, folder in (("HOME", "home"), ("TRIALFLOW_HOME", "experiments"),
                             ("TRIALFLOW_CONFIG_DIR", "config"), ("PREFECT_HOME", "prefect")):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    return tmp_path


AUDITED: dict[str, int] = {}  # folders audited this session -> experiments in them (counted in the summary)


def _experiments_under(top: Path) -> list[Path]:
    """Folders holding experiment records under ``top``; trial folders are not searched."""
    from trialflow.testing.audit import has_records

    found = []
    for folder, dirs, _ in os.walk(top):
        if "db" in dirs and has_records(folder):
            found.append(Path(folder))
            dirs[:] = []
    return found


@pytest.fixture(autouse=True)
def audited_experiments(request, isolated_home):
    """After each test, the experiment-record audit (``trialflow.testing.audit``) over every experiment
    the test left behind: under its tmp_path, and wherever its TRIALFLOW_HOME registry says. A broken
    invariant fails the test that made it. A test that breaks a record on purpose (the audit's own
    tests) says so with ``@pytest.mark.breaks_records``."""
    yield
    from trialflow.experiments import search_roots
    from trialflow.testing.audit import check_folder

    folders = set(_experiments_under(isolated_home))
    for root in search_roots():
        if root.is_dir() and not root.is_relative_to(isolated_home):
            folders.update(_experiments_under(root))
    if request.node.get_closest_marker("breaks_records"):
        AUDITED.update((str(folder), 0) for folder in folders)  # not audited, and not again at the end
        return
    problems = []
    for folder in sorted(folders):
        try:
            AUDITED[str(folder)], found = check_folder(folder)
            problems += found
        except Exception as exc:  # noqa: BLE001 -- an unreadable record is a broken one
            problems.append(f"{folder}: the record cannot be read ({type(exc).__name__}: {exc})")
    if problems:
        pytest.fail("the experiment-record audit found broken invariants:\n" + "\n".join(problems), pytrace=False)


LATE_PROBLEMS: list[str] = []


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _is_xdist_controller(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not _is_xdist_worker(config)


def pytest_sessionfinish(session, exitstatus):
    """Audit what module- and session-scoped fixtures left behind (no single test owns it): a broken
    record there fails the run. An xdist worker audits its own and hands the counts and problems to
    the controller (:func:`pytest_testnodedown`), which fails the run on them."""
    from trialflow.testing.audit import check_folder

    if _is_xdist_controller(session.config):
        _stop_shared_server(session.config)
        if LATE_PROBLEMS and session.exitstatus == 0:
            session.exitstatus = 1
        return
    base = session.config._tmp_path_factory.getbasetemp()
    for folder in _experiments_under(base):
        if str(folder) in AUDITED:
            continue
        try:
            AUDITED[str(folder)], found = check_folder(folder)
            LATE_PROBLEMS.extend(found)
        except Exception as exc:  # noqa: BLE001
            LATE_PROBLEMS.append(f"{folder}: the record cannot be read ({type(exc).__name__}: {exc})")
    if LATE_PROBLEMS and session.exitstatus == 0:
        session.exitstatus = 1
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["audit"] = {"audited": AUDITED, "late": LATE_PROBLEMS}


def _stop_shared_server(config) -> None:
    """Stop the kept server the workers shared (:func:`prefect_server`), once all of them are done."""
    home = _shared_server_home(config)
    if home.is_dir():
        from trialflow.server.kept_server import stop_server

        stop_server(home)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """On the xdist controller: one worker's audit joins the run's."""
    audit = getattr(node, "workeroutput", {}).get("audit", {})
    AUDITED.update(audit.get("audited", {}))
    LATE_PROBLEMS.extend(audit.get("late", []))


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"experiment-record audit: {sum(AUDITED.values())} experiments audited in "
                                f"{len(AUDITED)} folders")
    for problem in LATE_PROBLEMS:
        terminalreporter.write_line(f"broken record left by a shared fixture: {problem}", red=True)


@pytest.fixture(scope="session")
def memory_platform() -> str:
    """``platform: memory`` (trialflow.testing.memory: trials as threads in virtual time) known to this
    process; the platform name to put in a config."""
    from trialflow.testing.memory import PLATFORM_NAME, register

    register()
    return PLATFORM_NAME


def write_trial(directory: Path, body: str, name: str = "trial.py") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def signed_in(server) -> dict[str, str]:
    """The header a client of the kept ``server`` sends (its API asks every caller for its auth string)."""
    import base64

    return {"Authorization": "Basic " + base64.b64encode((server.auth or "").encode()).decode()}


def migrates_on_start(server) -> bool:
    """Whether the kept ``server`` ran Prefect's migration check at its start (its settings, as its API
    tells a client signed in with its auth string)."""
    import json
    import urllib.request

    request = urllib.request.Request(f"{server.url}/admin/settings", headers=signed_in(server))
    with urllib.request.urlopen(request, timeout=10) as response:
        return bool(json.loads(response.read())["server"]["database"]["migrate_on_start"])


def base_config(code_dir: Path, workdir: Path, **overrides) -> dict:
    config = {
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
        "trialCommand": f"{PYTHON} trial.py",
        "trialCodeDirectory": str(code_dir),
        "trialConcurrency": 2,
        "maxTrialNumber": 4,
        "experimentWorkingDirectory": str(workdir),
        "tuner": {"name": "Random", "classArgs": {"seed": 1}},
        "trainingService": {"platform": "local"},
    }
    config.update(overrides)
    return config


def nnictl_list_rows(listing: str) -> dict[str, dict[str, str]]:
    """The experiments in ``experiment list``'s output into a pipe, read as a script reads nnictl's
    (``Id: X    Name: Y    ...`` lines): each one's fields by name, under its id."""
    rows = (dict(field.split(": ", 1) for field in line.split("    "))
            for line in listing.splitlines() if line.startswith("Id: "))
    return {row["Id"]: row for row in rows}


def wait_for(predicate, timeout=90.0, interval=0.1):
    """Poll ``predicate`` until it returns something truthy; returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def only_experiment(root: Path) -> tuple[str, list[Any]] | None:
    """The one experiment under ``root`` whose run has begun (a run started elsewhere, a kernel's or a
    script's, whose id the test learns this way): its id and trial records, once its store reads; None
    before that (its folder is made before its store) and while there is none or more than one."""
    from trialflow.experiments import has_store, open_store

    made = [d for d in root.iterdir() if has_store(d)] if root.is_dir() else []
    if len(made) != 1:
        return None
    try:
        store = open_store(root, made[0].name)
        try:
            return made[0].name, store.trials()
        finally:
            store.close()
    except Exception:  # noqa: BLE001 -- its store still being made: looked at again on the next poll
        return None


def process_state(pid: int) -> str:
    """The process's state letter in ``/proc/<pid>/stat`` (``S`` sleeping, ``Z`` zombie, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def stop_process(pid: int) -> None:
    """SIGSTOP ``pid`` and return once it is stopped. The signal takes effect only when the process next
    runs, and on a busy machine that may be after it has done what the test stops it to keep it from
    (a keeper blocked in ``wait`` reaps its exited trial before it stops)."""
    import signal

    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: process_state(pid) in ("T", "t"), timeout=30, interval=0.01)


def run_in_thread(function, name: str | None = None) -> tuple[threading.Thread, dict]:
    """Start ``function()`` in a thread (named ``name``) that sees this context's Prefect settings (a new
    thread gets the settings Prefect read at import, so an experiment run in it would miss the session's
    server and start Prefect's temporary one); returns the thread and a dict holding ``result`` once the
    call returned."""
    outcome: dict = {}
    context = contextvars.copy_context()
    thread = threading.Thread(target=lambda: outcome.update(result=context.run(function)), name=name)
    thread.start()
    return thread, outcome


def start_controller(exp_id: str, root: Path, api_url: str, output=subprocess.DEVNULL) -> subprocess.Popen:
    """The experiment flow of ``exp_id`` in its own process (to be SIGKILLed and resumed); its stdout
    and stderr go to ``output`` (an open file, or nowhere)."""
    env = {**os.environ, "PREFECT_API_URL": api_url}
    return subprocess.Popen([sys.executable, "-m", "trialflow.cli", "_run", exp_id, "--root", str(root)], env=env,
                            stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def run_until_running_then_sigkill(config, api_url: str, running: int = 2, config_path: str | None = None):
    """Create the experiment of ``config`` (parsed; from ``config_path`` when given, as ``trialflow
    create --config`` does), run it in its own controller process and SIGKILL that process once
    ``running`` trials run; returns (experiment id, experiment dir, store)."""
    import signal

    from trialflow.experiments import create_experiment, open_store
    from trialflow.foundation.status import EXPERIMENT_ENDED

    exp_id, exp_dir = create_experiment(config, config_path)
    store = open_store(exp_dir.parent, exp_id)
    with tempfile.TemporaryFile("w+") as output:
        controller = start_controller(exp_id, exp_dir.parent, api_url, output)

        def running_or_ended() -> str:
            if len(store.trials(["RUNNING"])) == running:
                return "running"
            ended = controller.poll() is not None or store.experiment().status in EXPERIMENT_ENDED
            return "ended" if ended else ""

        try:
            reached = wait_for(running_or_ended, timeout=120)
        except AssertionError:
            reached = "timed out"
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
        if reached != "running":  # say why, for a failure seen only on a loaded CI machine
            output.seek(0)
            raise AssertionError(f"{running} trials never ran at once ({reached}): experiment "
                                 f"{store.experiment().status}, trials {[(t.id, t.status) for t in store.trials()]}; "
                                 f"the controller's output ends:\n{output.read()[-3000:]}")
    return exp_id, exp_dir, store


@pytest.fixture(scope="session")
def sshd_servers(tmp_path_factory):
    """Two real OpenSSH servers on 127.0.0.1 (generated host and user keys), stopped at the end."""
    from trialflow.testing.sshd import LoopbackSshd, SshdUnavailable

    try:
        servers = [LoopbackSshd(tmp_path_factory.mktemp(f"sshd{i}"), password_auth=True).start() for i in range(2)]
    except SshdUnavailable as exc:
        pytest.fail(f"{exc}: run the README test command (bash scripts/test.sh), which installs it")
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real single-node Slurm cluster (munged, slurmctld, slurmd) on 127.0.0.1, stopped at the end
    (and with the test process, should it die)."""
    from trialflow.testing.slurm import LoopbackSlurm, SlurmUnavailable

    try:
        cluster = LoopbackSlurm(tmp_path_factory.mktemp("slurm")).start()
    except SlurmUnavailable as exc:
        pytest.fail(f"{exc}: run the README test command (bash scripts/test.sh), which installs them")
    yield cluster
    cluster.stop()


def slurm_section(cluster, workdir: Path, server=None, **fields) -> dict:
    """A ``platform: slurm`` section for the test cluster: this machine as the login node, or
    ``server`` (a test sshd) reached over SSH, where ``loginCommand`` points Slurm's commands at it."""
    section = {"platform": "slurm", "remoteWorkingDirectory": str(workdir), "pythonPath": os.path.dirname(PYTHON),
               "timeLimit": "10", **fields}
    if server is not None:
        section.update(host="127.0.0.1", port=server.port, user=server.user, sshKeyFile=str(server.key_file),
                       loginCommand=f"export SLURM_CONF={cluster.conf}")
    return section


@pytest.fixture
def known_hosts(sshd_servers, tmp_path):
    """A known_hosts file trusting both test servers."""
    path = tmp_path / "known_hosts"
    path.write_text("".join(s.known_hosts.read_text() for s in sshd_servers))
    return path


def machine(server, workdir: Path, **fields) -> dict:
    """A machineList entry for a test server, with the controller's Python on the worker."""
    return {"host": "127.0.0.1", "port": server.port, "user": server.user, "sshKeyFile": str(server.key_file),
            "pythonPath": os.path.dirname(PYTHON), "remoteWorkingDirectory": str(workdir), **fields}


def fake_nvidia_smi(directory: Path, gpus: int, busy_uuid: str | None = None) -> Path:
    """An nvidia-smi on PATH answering the two queries the scheduler makes; counts its calls."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = "\\n".join(f"{i}, GPU-{i}, 0, 10, 16000" for i in range(gpus))
    apps = f"{busy_uuid}, 4242" if busy_uuid else ""
    script = directory / "nvidia-smi"
    script.write_text(f"""#!/bin/bash
echo x >> "{directory}/calls"
case "$1" in
  --query-gpu=*) printf "{rows}\\n" ;;
  --query-compute-apps=*) printf "{apps}\\n" ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return directory


NFS_SERVER, NFS_PATH = "nfs.cluster.local", "/exports/nni"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium's executable (Debian's chromium)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("chromium is not installed: run the README test command (bash scripts/test.sh), which installs it")
    return found


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL server on 127.0.0.1 for the session (Debian's postgresql)."""
    from trialflow.testing.postgres import LocalPostgres

    with LocalPostgres() as server:
        yield server


@pytest.fixture(scope="session")
def mlflow_server():
    """One MLflow tracking server on 127.0.0.1 for the session, with basic authentication (``mlflow
    server`` from PyPI); a test that stops it starts it again."""
    from trialflow.testing.mlflow_server import LocalMlflow

    server = LocalMlflow().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A store URL: the embedded SQLite file, or a fresh database on the session's PostgreSQL."""
    if request.param == "sqlite":
        from trialflow.records.store_engine import embedded_url

        return embedded_url(tmp_path)
    import uuid

    import sqlalchemy as sa

    server = request.getfixturevalue("postgres_server")
    name = f"t{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(server.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    return server.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(scope="session")
def k8s_emulator(tmp_path_factory):
    """One Kubernetes API emulator for the session; its NFS export is a local folder (``.nfs_dir``)."""
    from trialflow.testing.emulators.kubernetes import KubernetesEmulator

    root = tmp_path_factory.mktemp("k8s")
    nfs = root / "nfs"
    nfs.mkdir()
    emulator = KubernetesEmulator(root / "cluster", {f"{NFS_SERVER}:{NFS_PATH}": nfs}, kill_grace=1.0).start()
    emulator.nfs_dir = nfs
    emulator.kubeconfig = emulator.write_kubeconfig(root / "kubeconfig")
    yield emulator
    emulator.stop()


@pytest.fixture
def k8s(k8s_emulator, monkeypatch):
    """The emulator, with KUBECONFIG pointing at it for this test, and no fault an earlier test left."""
    monkeypatch.setenv("KUBECONFIG", str(k8s_emulator.kubeconfig))
    k8s_emulator.clear_faults()
    return k8s_emulator


def k8s_section(kind: str, nfs_dir: Path, reuse: bool = False, channel: str = "http",
                command: str = 'python3 "$NNI_TRIAL_JOB_ID.py"') -> dict:
    """A trainingService section for ``kind`` in tfjob, pytorchjob, framework, adaptdl."""
    storage = {"storageType": "nfs", "server": NFS_SERVER, "path": NFS_PATH, "localMountPoint": str(nfs_dir)}
    role = {"replicas": 1, "command": command, "cpuNumber": 1, "memorySize": "512mb", "gpuNumber": 0}
    if kind == "tfjob":
        return {"platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1", "storage": storage,
                "worker": role, "reuseMode": reuse, "metricChannel": channel}
    if kind == "pytorchjob":
        return {"platform": "kubeflow", "operator": "pytorch-operator", "apiVersion": "v1", "storage": storage,
                "master": role, "worker": {**role, "command": "echo worker replica"}, "reuseMode": reuse,
                "metricChannel": channel}
    if kind == "framework":
        return {"platform": "frameworkcontroller", "storage": storage, "reuseMode": reuse, "metricChannel": channel,
                "taskRoles": [{"name": "worker", "taskNumber": 1, "command": command, "gpuNumber": 0,
                               "cpuNumber": 1, "memorySize": "512mb",
                               "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1,
                                                                    "minSucceedTaskCount": 1}}]}
    return {"platform": "adl", "metricChannel": channel,
            "nfs": {"server": NFS_SERVER, "path": NFS_PATH, "containerMountPath": "/nfs",
                    "localMountPoint": str(nfs_dir)}, "checkpoint": {"storageClass": "nfs", "storageSize": "1Gi"}}


PAI_USER, PAI_TOKEN, PAI_STORAGE = "alice", "pai-token-9d2f7c1e5b", "confignfs-data"


@pytest.fixture(scope="session")
def openpai_emulator(tmp_path_factory):
    """One OpenPAI REST server emulator (behind pylon's /rest-server) for the session; its storage
    ``confignfs-data`` is a local folder (``.storage_dir``)."""
    from trialflow.testing.emulators.openpai import OpenPAIEmulator

    root = tmp_path_factory.mktemp("openpai")
    storage = root / "storage"
    storage.mkdir()
    emulator = OpenPAIEmulator(root / "cluster", {PAI_USER: PAI_TOKEN}, {PAI_STORAGE: storage}).start()
    emulator.storage_dir = storage
    yield emulator
    emulator.stop()


def openpai_section(emulator, reuse: bool = False, channel: str = "http", **extra) -> dict:
    """The OpenPAI example of the README against ``emulator``."""
    return {"platform": "openpai", "host": emulator.url, "username": PAI_USER, "token": PAI_TOKEN,
            "trialCpuNumber": 1, "trialMemorySize": "1gb", "trialGpuNumber": 0, "storageConfigName": PAI_STORAGE,
            "localStorageMountPoint": str(emulator.storage_dir),
            "containerStorageMountPoint": f"/mnt/{PAI_STORAGE}", "dockerImage": "msranni/nni:latest",
            "reuseMode": reuse, "metricChannel": channel, **extra}


DLTS_EMAIL, DLTS_PASSWORD, DLTS_TEAM = "alice@example.org", "dlts-secret-4b7e2a9c", "nni-team"


@pytest.fixture(scope="session")
def dlts_emulator(tmp_path_factory):
    """One DLTS dashboard emulator for the session; the work directory is a local folder
    (``.work_dir``) that jobs see at ``/home/alice``."""
    from trialflow.testing.emulators.dlts import DLTSEmulator

    root = tmp_path_factory.mktemp("dlts")
    work = root / "work"
    work.mkdir()
    emulator = DLTSEmulator(root / "cluster", {DLTS_EMAIL: DLTS_PASSWORD}, {DLTS_TEAM: {".default": ["P40"]}},
                            ("/home/alice", work)).start()
    emulator.work_dir = work
    yield emulator
    emulator.stop()


def dlts_section(emulator, reuse: bool = False, channel: str = "http", **extra) -> dict:
    return {"platform": "dlts", "dashboard": emulator.url + "/", "team": DLTS_TEAM, "email": DLTS_EMAIL,
            "password": DLTS_PASSWORD, "image": "msranni/nni:latest", "trialGpuNumber": 0,
            "localStorageMountPoint": str(emulator.work_dir), "containerStorageMountPoint": "/home/alice",
            "reuseMode": reuse, "metricChannel": channel, **extra}


def service_of(tmp_path: Path, section: dict, command: str = 'python3 "$NNI_TRIAL_JOB_ID.py"'):
    """The training service of the trainingService ``section`` for a new experiment under ``tmp_path``
    (code directory ``tmp_path/code``; by default each trial runs the script named after it)."""
    from trialflow.config.platforms import PLATFORM_CONFIGS
    from trialflow.foundation.ids import new_experiment_id
    from trialflow.platforms import create_service

    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    fields = {k: v for k, v in section.items() if k != "platform"}
    config = PLATFORM_CONFIGS[section["platform"]](trial_command=command, trial_code_directory=code, **fields)
    return create_service(config, tmp_path / "exp" / new_experiment_id())


def submit_one(service, tmp_path: Path, trial_id: str, body: str):
    """Prepare ``service`` and submit trial ``trial_id`` running ``body`` (its own script); the handle."""
    from trialflow.platforms import TrialSpec

    service.prepare()
    write_trial(tmp_path / "code", body, f"{trial_id}.py")
    code = service.upload_code(tmp_path / "code")
    return service.submit(TrialSpec(service.experiment_id, trial_id, 0, 0, {"x": 1}, service.config.trial_command,
                                    tmp_path / "code"), code)


DLC_KEY_ID, DLC_KEY_SECRET, DLC_NAS = "LTAI5tTestKeyId0001", "dlc-secret-6c1f8e3a9b", "nas-ds-0001"


@pytest.fixture(scope="session")
def dlc_emulator(tmp_path_factory):
    """One PAI-DLC API emulator for the session; the NAS data source is a local folder (``.nas_dir``)."""
    from trialflow.testing.emulators.dlc import DLCEmulator

    root = tmp_path_factory.mktemp("dlc")
    nas = root / "nas"
    nas.mkdir()
    emulator = DLCEmulator(root / "cluster", {DLC_KEY_ID: DLC_KEY_SECRET}, {DLC_NAS: nas}).start()
    emulator.nas_dir = nas
    yield emulator
    emulator.stop()


def dlc_section(emulator, reuse: bool = False, channel: str = "http", **extra) -> dict:
    """NNI's documented DLC example, pointed at ``emulator``."""
    return {"platform": "dlc", "type": "Worker", "image": "registry-vpc.cn-hangzhou.aliyuncs.com/pai-dlc/"
            "tensorflow-training:1.15.0-cpu-py36-ubuntu18.04", "jobType": "TFJob", "podCount": 1,
            "ecsSpec": "ecs.c6.large", "region": "cn-hangzhou", "workspaceId": "ws-1", "nasDataSourceId": DLC_NAS,
            "accessKeyId": DLC_KEY_ID, "accessKeySecret": DLC_KEY_SECRET, "endpoint": emulator.url,
            "localStorageMountPoint": str(emulator.nas_dir), "containerStorageMountPoint": "/root/data/",
            "reuseMode": reuse, "metricChannel": channel, **extra}


@pytest.fixture(scope="session")
def aml_emulator(tmp_path_factory):
    """One Azure ML workspace emulator for the session; its datastore ``workspaceworkingdirectory`` is a
    local folder (``.datastore_dir``). The SDK's endpoint override and the managed identity endpoint
    are set in this process's environment (controllers started by tests inherit them)."""
    from trialflow.testing.emulators.azureml import AzureMLEmulator

    root = tmp_path_factory.mktemp("aml")
    store = root / "datastore"
    store.mkdir()
    emulator = AzureMLEmulator(root / "workspace", {"workspaceworkingdirectory": store}).start()
    emulator.datastore_dir = store
    saved = {k: os.environ.get(k) for k in emulator.client_env()}
    os.environ.update(emulator.client_env())
    yield emulator
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    emulator.stop()


def aml_section(emulator, reuse: bool = False, channel: str = "http", **extra) -> dict:
    """NNI's AML example (subscription, resource group, workspace, compute, image) against ``emulator``,
    with the datastore mounted here; the credential is azure-identity's default chain (here: the
    emulator's managed identity endpoint)."""
    return {"platform": "aml", "subscriptionId": emulator.subscription, "resourceGroup": emulator.resource_group,
            "workspaceName": emulator.workspace, "computeTarget": "cpu-cluster", "dockerImage": "msranni/nni:latest",
            "localStorageMountPoint": str(emulator.datastore_dir), "reuseMode": reuse, "metricChannel": channel,
            **extra}


FINAL_ONLY = "import nni\nnni.get_next_parameter()\nnni.report_final_result(1)\n"


def wait_until_trial_runs(svc, trial_id: str, timeout: float = 30) -> None:
    """Wait until a job platform's trial command started (its keeper's ``started`` on the share): a
    job's running state comes before it."""
    started = svc.storage.path(svc.experiment_id, "trials", trial_id) / ".nni" / "started"
    wait_for(started.exists, timeout=timeout)


def job_platform(section, emulator_fixture: str, variants: dict):
    """A job platform's test helpers: ``service_for(tmp_path, emulator, reuse, channel, **fields)``,
    the contract's ``service`` fixture over ``variants`` (id -> (reuse, channel)), and
    ``run_one(tmp_path, emulator, trial_id, body, **fields)`` -> (service, handle)."""
    from trialflow.testing.contract import prepared

    def service_for(tmp_path: Path, emulator, reuse: bool = False, channel: str = "http", **extra):
        return service_of(tmp_path, section(emulator, reuse, channel, **extra))

    @pytest.fixture(params=list(variants), ids=list(variants))
    def service(request, tmp_path):
        emulator = request.getfixturevalue(emulator_fixture)
        svc = prepared(service_for(tmp_path, emulator, *variants[request.param]), tmp_path / "code")
        yield svc
        svc.close()

    def run_one(tmp_path: Path, emulator, trial_id: str = "One1", body: str = FINAL_ONLY, **extra):
        svc = service_for(tmp_path, emulator, **extra)
        return svc, submit_one(svc, tmp_path, trial_id, body)

    return service_for, service, run_one


class _WorkPool:
    """The work pool of this worker process: a real ``prefect server start`` on 127.0.0.1 with a
    ``process`` work pool and a real worker (``prefect worker start``), started by the first test that
    asks for it and stopped once the tests using it are done (:func:`pytest_runtest_teardown`): its
    worker asks the server for work every second, which costs the other tests a part of a core for
    as long as both run. A later test that asks for it starts it again."""

    def __init__(self) -> None:
        self.server: Any = None
        self.factory: Any = None

    def get(self) -> Any:
        if self.server is None:
            from trialflow.testing.prefect_server import PrefectServer

            home = self.factory.mktemp("prefect-pool")
            server = PrefectServer(home / "server").start()
            self.server = server
            subprocess.run(["prefect", "work-pool", "create", "trialflow-pool", "--type", "process"],
                           env=server.env, check=True, capture_output=True, timeout=120)
            server.worker = server.spawn(["prefect", "worker", "start", "--pool", "trialflow-pool", "--limit", "20"],
                                         home / "worker.log", PREFECT_LOGGING_LEVEL="INFO")  # runs log trial output
            server.worker_log = home / "worker.log"
            server.share_dir = home / "share"
            server.share_dir.mkdir()
        return self.server

    def stop(self) -> None:
        from trialflow.testing.prefect_server import stop_group

        server, self.server = self.server, None
        if server is None:
            return
        if getattr(server, "worker", None) is not None:
            stop_group(server.worker)
        _drain_prefect_events(logs=True)
        server.stop()


_WORK_POOL = _WorkPool()


@pytest.fixture(scope="session")
def _work_pool_session(tmp_path_factory):
    _WORK_POOL.factory = tmp_path_factory
    yield _WORK_POOL
    _WORK_POOL.stop()


@pytest.fixture
def prefect_pool(_work_pool_session):
    """The work pool (:class:`_WorkPool`): its server, whose ``.worker``, ``.worker_log`` and
    ``.share_dir`` (the shared storage both see) come with it."""
    return _work_pool_session.get()


def _timeline(event: str, nodeid: str) -> None:
    """With ``TRIALFLOW_TEST_TIMELINE=FILE``, a line per test start and end (time, worker, event, test, the
    worker's own CPU-seconds so far), and one per failed phase (``failed-setup``, ``failed-call``,
    ``failed-teardown``): where a parallel run's time goes, which tests ran together while the cores idled,
    which tests spend the worker's CPU, and what failed before pytest wrote its report."""
    path = os.environ.get("TRIALFLOW_TEST_TIMELINE")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.2f}\t{worker}\t{event}\t{nodeid}\t{time.process_time():.2f}\n")


def pytest_runtest_logstart(nodeid, location):
    _timeline("start", nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _timeline("end", nodeid)


def pytest_runtest_logreport(report):
    if report.failed:
        _timeline(f"failed-{report.when}", report.nodeid)


def _temporary_servers() -> int:
    module = sys.modules.get("prefect.server.api.server")
    return len(module.SubprocessASGIServer._instances) if module is not None else 0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that starts Prefect's temporary server in its process fails, naming the fix: outside ``e2e``
    it runs a flow (the quick loop stays free of servers and experiments); with the ``prefect_server``
    fixture it missed the session's server (a flow run in a new thread: a server start and its CPU for
    nothing)."""
    before = _temporary_servers()
    result = yield
    if _temporary_servers() > before:
        if "prefect_server" in getattr(item, "fixturenames", ()):
            pytest.fail("this test runs a flow on Prefect's temporary server beside the session's: run it in a "
                        "thread from run_in_thread (a new thread has the settings Prefect read at import)",
                        pytrace=False)
        if not item.get_closest_marker("e2e"):
            pytest.fail("this test runs a flow on Prefect's temporary server: give it the prefect_server "
                        "fixture (or mark it e2e)", pytrace=False)
    return result


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    """After the last of consecutive tests that use the work pool, stop it (the pool's tests are one
    xdist group, sent to one worker together)."""
    if "prefect_pool" in getattr(item, "fixturenames", ()) and \
            (nextitem is None or "prefect_pool" not in getattr(nextitem, "fixturenames", ())):
        _WORK_POOL.stop()


def _drain_prefect_events(logs: bool = False) -> None:
    """Stop Prefect's in-process events worker once its queue is sent. It keeps the API URL it started
    with (its instances are not keyed by it, unlike the log worker's), so a test that switches
    PREFECT_API_URL would otherwise send its task-run events -- from which a server records the task
    runs -- to the previous test's server; the next event starts a worker on the URL then in force.
    ``logs``: send the queued API logs too (before a server stops, which would leave them to be
    refused at interpreter exit)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    EventsWorker.drain_all(timeout=30, at_exit=False)
    if logs:
        APILogWorker.drain_all(timeout=30, at_exit=False)


@pytest.fixture
def on_pool(prefect_pool, monkeypatch):
    """The work-pool server as this test's Prefect API (flows, the service and blocks use it)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("PREFECT_API_URL", prefect_pool.url)
    _drain_prefect_events()
    try:
        with temporary_settings(updates={PREFECT_API_URL: prefect_pool.url}):
            yield prefect_pool
    finally:
        _drain_prefect_events()


def prefect_section(pool, reuse: bool = False, channel: str = "http", **extra) -> dict:
    return {"platform": "prefect", "workPool": "trialflow-pool", "localStorageMountPoint": str(pool.share_dir),
            "reuseMode": reuse, "metricChannel": channel, **extra}


OTHER_USER = "trialflow-other"


def as_other_user(*command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run by a second Unix user of this machine (made once; the suite runs as root)."""
    if subprocess.run(["id", OTHER_USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/bash", OTHER_USER],
                       check=True, capture_output=True)
    return subprocess.run(["runuser", "-u", OTHER_USER, "--", *command], capture_output=True, text=True, timeout=60)


NO_SOCK_DIAG = """
import socket
_real = socket.socket
class _NoSockDiag(_real):  # as a sandbox whose kernel has no sock_diag
    def __init__(self, family=-1, *args, **kwargs):
        if family == socket.AF_NETLINK:
            raise OSError(93, "Protocol not supported")
        super().__init__(family, *args, **kwargs)
socket.socket = _NoSockDiag
"""


def without_sock_diag(folder: Path) -> dict[str, str]:
    """The environment (PYTHONPATH) under which Python programs find no netlink ``sock_diag``, as in a
    sandbox whose kernel cannot say which user made a connection: a ``sitecustomize`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(NO_SOCK_DIAG)
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def raw_request(port: int, method: str, path: str, body: str = "", user: str | None = OTHER_USER,
                **headers: str) -> str:
    """What an HTTP request to a server on 127.0.0.1 gets, sent by ``user`` (None: this user) through
    bash's /dev/tcp (nothing to install); "" when the server closes the connection unanswered."""
    head = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", "Content-Length": str(len(body)),
            "Connection": "close", **{k.replace("_", "-"): v for k, v in headers.items()}}
    request = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n" + body
    script = f'exec 3<>/dev/tcp/127.0.0.1/{port}; printf %s "$1" >&3; timeout 10 cat <&3'
    command = ("bash", "-c", script, "request", request)
    if user is None:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    return as_other_user(*command).stdout
