"""A benchmark's own trialflow home, so that running a benchmark leaves the user's trialflow as it was.

Lifecycle: :func:`use_own_home`, called first in a benchmark's ``main()``, points ``TRIALFLOW_HOME`` at a
new temporary folder unless the caller set one: the experiments the benchmark runs, their registry lines
and the kept Prefect server they start are its own, so the user's registry gains no line for a folder the
benchmark removes, no kept server is left running in the user's home, and no figure depends on whether
the user's kept server was up. At exit it stops that home's kept server and removes the folder.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path


def use_own_home() -> Path:
    """The trialflow home this process and its children use from now on (the caller's own
    ``TRIALFLOW_HOME`` when it set one, which is then left as it is at exit)."""
    if os.environ.get("TRIALFLOW_HOME"):
        return Path(os.environ["TRIALFLOW_HOME"])
    home = Path(tempfile.mkdtemp(prefix="trialflow-benchmark-home-"))
    os.environ["TRIALFLOW_HOME"] = str(home)
    atexit.register(_remove, home)
    return home


def _remove(home: Path) -> None:
    from trialflow.server.kept_server import stop_server

    try:
        stop_server(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
