#!/usr/bin/env bash
# The test suite, from a fresh machine: installs what it needs, then lint, type check and pytest.
set -uo pipefail
cd "$(dirname "$0")/.."

# The remote-service tests start real OpenSSH servers on 127.0.0.1 (Debian's openssh-server); the
# store tests a throwaway PostgreSQL cluster on 127.0.0.1 (Debian's postgresql).
missing=""
if [ ! -x /usr/sbin/sshd ] || ! command -v ssh-keygen >/dev/null || ! command -v scp >/dev/null; then
  missing="openssh-server openssh-client"
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing="$missing postgresql"
fi
# The dashboard test opens optuna-dashboard and the HTML report in headless Chromium (Debian's chromium).
if ! command -v chromium >/dev/null; then
  missing="$missing chromium"
fi
# The Slurm tests start a throwaway single-node cluster on 127.0.0.1 (Debian's slurm-wlm and munge).
if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || ! command -v sbatch >/dev/null || [ ! -x /usr/sbin/munged ]; then
  missing="$missing slurm-wlm munge"
fi
# The Debian packages install while the Python ones do (neither needs the other): on a fresh
# machine apt's install alone took 24 s, after its index update (the Python packages' below).
apt_pid=""
if [ -n "$missing" ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null; } &
  apt_pid=$!
fi

# uv installs the Python packages (the same versions pip resolves) and compiles them on every core:
# on a fresh machine 36 s, where pip took 113 s and compiling after it 41 s more; 2 s where all was
# installed already (pip 16 s, the compile walk 7 s). A package installed before keeps its bytecode.
# uv reads no pip configuration (local indexes, find-links): where it cannot install, pip does.
python3 -m pip install --disable-pip-version-check -q 'uv>=0.5' || exit 1
if ! python3 -m uv pip install -q --compile-bytecode --python "$(python3 -c 'import sys; print(sys.executable)')" \
    -e '.[test]'; then
  echo "uv could not install the test extras (above): installing them with pip" >&2
  python3 -m pip install --disable-pip-version-check -q -e '.[test]' || exit 1
fi

export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_LOGGING_LEVEL=CRITICAL

# mypy (~40-80 s of one core without its cache: it follows imports into ~7,600 modules) runs beside the rest:
# the Debian packages' install and pytest's first seconds, which wait on its workers and servers; its
# verdict is read after pytest
typecheck=$(mktemp)
# Its cache lives in the user's cache folder, not in the checkout, so a new clone's check starts from the
# last one's (mypy checks again each module whose content or dependencies changed): 38 s, then 1.3 s.
mypy_cache=${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trialflow-tests/mypy}
python3 -m mypy --cache-dir "$mypy_cache" trialflow > "$typecheck" 2>&1 &
mypy_pid=$!
# a step below that fails ends the script: mypy with it, and its output file
trap '[ -n "$mypy_pid" ] && kill "$mypy_pid" 2>/dev/null; rm -f "$typecheck"' EXIT
python3 -m ruff check trialflow tests benchmarks || exit 1
# trialflow's bytecode, written once: the suite's thousands of processes import its modules, and where the
# environment sets PYTHONDONTWRITEBYTECODE each of them compiled those modules again
python3 -m compileall -q trialflow >/dev/null || exit 1
if [ -n "$apt_pid" ] && ! wait "$apt_pid"; then
  echo "could not install $missing (needed by the remote, store, dashboard and Slurm tests)" >&2
  exit 1
fi
# Four pytest-xdist workers (TRIALFLOW_TEST_WORKERS=N for another number, 0 for one process): ~15 min
# on two cores, where half of a test's time is waiting (three: ~16.5; one process: ~31); the work pool's,
# the Slurm cluster's and the kept-server tests each stay on one worker (docs/testing.md#parallel-workers).
# The 30 slowest tests go to the log.
python3 -m pytest -q -n "${TRIALFLOW_TEST_WORKERS:-4}" --dist loadgroup --durations=30 "$@"
rc=$?
wait "$mypy_pid"
mypy_rc=$?
mypy_pid=""
cat "$typecheck"
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
if [ "$mypy_rc" -ne 0 ]; then
  echo "mypy found errors (above): failing" >&2
  exit 1
fi
exit "$rc"
