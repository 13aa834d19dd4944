"""THE platform table: one row per platform -- its config model (the row's name comes from it), its
service class, its credentials block, the pip extra it needs and its retry policy. The service
factory, the list of available platforms in error messages and the Prefect tasks' retries read it;
the config loader's union and the v1 converter read ``trialflow.config.PLATFORM_CONFIGS`` (the
config layer sits below this one), and a test holds the two to the same names.

Platforms of other packages add their row through the ``trialflow.platforms`` entry point
(``trialflow.config.plugins``); :func:`platform` and :func:`available` include them.
A new built-in platform adds the files listed in ``docs/platforms.md#adding-a-platform``. Nothing in
``tasks/``, ``flows/`` or the other platforms changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect.blocks.core import Block

from ..blocks import (
    AzureMLCredentials,
    DLTSCredentials,
    KubernetesCredentials,
    OpenPAICredentials,
    PAIDLCCredentials,
    SSHCredentials,
)
from ..config import PLATFORM_CONFIGS, TrainingServiceConfig
from ..config.platforms import (
    AdlConfig,
    AmlConfig,
    DlcConfig,
    DltsConfig,
    FrameworkControllerConfig,
    KubeflowConfig,
    LocalConfig,
    OpenpaiConfig,
    PrefectPoolConfig,
    RemoteConfig,
    SlurmConfig,
)
from .adaptdl import AdaptDLTrainingService
from .aml import AzureMLTrainingService
from .base import TrainingService
from .dlc import DLCTrainingService
from .dlts import DLTSTrainingService
from .errors import PlatformError, RetryPolicy
from .frameworkcontroller import FrameworkControllerTrainingService
from .kubeflow import KubeflowTrainingService
from .local import LocalTrainingService
from .openpai import OpenPAITrainingService
from .prefect_pool import PrefectWorkPoolService
from .remote import RemoteTrainingService
from .slurm import SlurmTrainingService


@dataclass(frozen=True)
class Platform:
    config: type[TrainingServiceConfig]
    service: type[TrainingService] | None  # None: its config validates, but this version cannot run it (create says so)
    block: type[Block] | None = None
    extra: str | None = None  # ``pip install 'trialflow[<extra>]'``
    retry: RetryPolicy = RetryPolicy()

    @property
    def name(self) -> str:
        return str(self.config.model_fields["platform"].default)


_ROWS = (
    Platform(LocalConfig, LocalTrainingService, retry=RetryPolicy(retries=3, delay=0.2)),
    Platform(RemoteConfig, RemoteTrainingService, SSHCredentials),
    Platform(KubeflowConfig, KubeflowTrainingService, KubernetesCredentials, "kubernetes"),
    Platform(FrameworkControllerConfig, FrameworkControllerTrainingService, KubernetesCredentials, "kubernetes"),
    Platform(AdlConfig, AdaptDLTrainingService, KubernetesCredentials, "kubernetes"),
    Platform(OpenpaiConfig, OpenPAITrainingService, OpenPAICredentials),
    Platform(DltsConfig, DLTSTrainingService, DLTSCredentials),
    Platform(AmlConfig, AzureMLTrainingService, AzureMLCredentials, "aml"),
    Platform(DlcConfig, DLCTrainingService, PAIDLCCredentials, "dlc"),
    Platform(PrefectPoolConfig, PrefectWorkPoolService),  # the controller's own Prefect API: no credentials
    Platform(SlurmConfig, SlurmTrainingService, SSHCredentials),  # the block: its SSH route to a login node
)
PLATFORMS: dict[str, Platform] = {row.name: row for row in _ROWS}


_SKIPPED: set[str] = set()  # plugin rows already warned about


def plugin_rows() -> dict[str, Platform]:
    """The rows other packages registered (entry point group ``trialflow.platforms``, or
    ``register_platform`` in this process) whose service is a :class:`TrainingService`; others are
    skipped with a warning (once per process and name). Read anew at each call: a row registered
    later counts from then on."""
    from ..config.plugins import log, platform_plugins

    rows = {}
    for name, row in platform_plugins().items():
        if name in PLATFORMS:
            problem = "a built-in platform has that name"
        elif isinstance(row, Platform) and isinstance(row.service, type) and issubclass(row.service, TrainingService):
            rows[name] = row
            continue
        else:
            problem = ("its entry point must name a trialflow.platforms.Platform row whose service is a "
                       "TrainingService subclass")
        if name not in _SKIPPED:
            _SKIPPED.add(name)
            log.warning("platform plugin %r is skipped: %s", name, problem)
    return rows


def available() -> list[str]:
    """Names of the platforms whose training service can run (built-in, then plugins)."""
    rows = {**PLATFORMS, **plugin_rows()}
    return [name for name, row in rows.items() if row.service is not None]


def platform(name: str) -> Platform:
    row = PLATFORMS.get(name) or plugin_rows().get(name)
    if row is None:
        raise PlatformError(f"unknown platform {name!r}; known: {', '.join([*PLATFORMS, *plugin_rows()])}")
    return row


def create_service(config: TrainingServiceConfig, experiment_dir: Path) -> TrainingService:
    """The training service of ``config``'s platform for the experiment in ``experiment_dir``."""
    row = platform(config.platform)
    if row.service is None:
        raise PlatformError(f"the {config.platform!r} training service is not available in this version of "
                            f"trialflow; available: {', '.join(available())}")
    return row.service(config, experiment_dir)  # type: ignore[call-arg]


assert set(PLATFORMS) == set(PLATFORM_CONFIGS), "the platform table and PLATFORM_CONFIGS name different platforms"
