"""NNI's first command, ``hello``: writes a small ready-to-run experiment (``hello_hpo/``: NNI's Python API
starting ten trials of a plain-Python model) into a new ``nni_hello_hpo`` folder of the current one.

Only that new folder is written: a file, folder or link already named so is left as it is and the
command refuses, so nothing of the user's (or, in a shared folder, of another user's) is replaced or
written through.
"""

from __future__ import annotations

import os
from pathlib import Path

from .common import CliError, console

EXAMPLE = Path(__file__).with_name("hello_hpo")
TARGET = "nni_hello_hpo"  # NNI's name for it, which its docs tell users to run


def hello() -> None:
    """Create the "hello" example in the current directory (nni_hello_hpo/: a ten-trial experiment
    through NNI's Python API); run it with python3 nni_hello_hpo/main.py."""
    target = Path(TARGET)
    try:
        os.mkdir(target)  # fails on anything already named so, a link included: nothing is written through it
    except FileExistsError:
        raise CliError(f"{TARGET} already exists here: run python3 {TARGET}/main.py, or run trialflow hello "
                       "in another folder") from None
    except OSError as exc:
        raise CliError(f"cannot create {TARGET} here ({exc.strerror}): run trialflow hello in a folder you "
                       "can write to") from None
    for name in ("main.py", "model.py"):
        # created, never opened through a link another process put there since the folder was made
        fd = os.open(target / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write((EXAMPLE / name).read_bytes())
    console.print(f'A hyperparameter optimization example has been created at "{TARGET}" directory.\n'
                  f'Please run "python3 {TARGET}/main.py" to try it out.', highlight=False, soft_wrap=True)
