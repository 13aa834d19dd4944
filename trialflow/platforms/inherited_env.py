"""The environment a trial started on this machine inherits from its controller (local trials, and
Slurm jobs submitted from this machine as a login node, which take the submitting environment).

The controller holds credentials of its own there: the store's database password, the Prefect API's
key or auth string. Trials run the user's code, on shared machines often code from others, and write
their environment into logs and crash reports; none of them needs these. NNI's dispatcher variables,
which a controller running a customized tuner or assessor holds (as NNI's dispatcher does, and NNI's
trials do not), stay with it too. Everything else (the user's PATH, CUDA and framework settings, their own
tokens) passes unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CONTROLLER_SECRETS = frozenset({
    "PGPASSWORD",  # the store's PostgreSQL password (experiments.open_store)
    "PREFECT_API_KEY",  # Prefect Cloud
    "PREFECT_API_AUTH_STRING",  # a Prefect server's basic auth, as its clients send it
    "PREFECT_SERVER_API_AUTH_STRING",  # the same, as a Prefect server checks it
})
# NNI's dispatcher's own (trialflow.tuners.custom.dispatcher_environment)
DISPATCHER_ONLY = frozenset({"NNI_CHECKPOINT_DIRECTORY", "NNI_MODE"})


def inherited_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without :data:`CONTROLLER_SECRETS` and :data:`DISPATCHER_ONLY`."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k not in CONTROLLER_SECRETS and k not in DISPATCHER_ONLY}
