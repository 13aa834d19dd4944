"""A training platform of your own for trialflow: ``platform: nice`` runs each trial on this machine
like ``local``, at the CPU priority ``niceness`` gives it, so a sweep leaves the machine usable.

Three parts make a platform: a config model (its ``platform`` name and fields, camelCase in the
YAML), a training service (here the local one with the trial command run under ``nice``), and the
row that joins them. The package's entry point in the ``trialflow.platforms`` group names the row;
trialflow finds it when a config asks for ``platform: nice``.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Literal

from pydantic import Field

from trialflow.config import LocalConfig
from trialflow.platforms import CodeRef, Platform, RetryPolicy, TrialHandle, TrialSpec
from trialflow.platforms.local import LocalTrainingService


class NiceConfig(LocalConfig):
    platform: Literal["nice"] = "nice"  # type: ignore[assignment]
    niceness: int = Field(default=10, ge=0, le=19, description="the trials' nice value (0: as local, 19: lowest)")


class NiceTrainingService(LocalTrainingService):
    """Local trials, started under ``nice -n <niceness>``."""

    platform = "nice"
    config: NiceConfig

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        command = f"exec nice -n {int(self.config.niceness)} /bin/bash -c {shlex.quote(spec.command)}"
        return super().submit(dataclasses.replace(spec, command=command), code)


PLATFORM = Platform(NiceConfig, NiceTrainingService, retry=RetryPolicy(retries=3, delay=0.2))
