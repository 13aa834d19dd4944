"""The ``trainingService`` section of NNI's v2 config (reference docs/nni.md#platform-config-sections):
one platform's section or a list of them (a hybrid experiment), told apart by ``platform``, and the
top-level ``sharedStorage``. Each built-in platform's section model is ``sections/<name>.py``, named as
its service module (``trialflow/platforms/<name>.py``); a platform a plugin registered is
validated by the plugin's own model. The registry in ``trialflow.platforms`` says which can run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Discriminator, PlainValidator, SecretStr, SerializeAsAny, Tag, model_validator

from ._base import ConfigModel, ConfigPath, canonical_key
from .sections.adaptdl import AdlConfig
from .sections.aml import AmlConfig
from .sections.base import TrainingServiceConfig
from .sections.dlc import DlcConfig
from .sections.dlts import DltsConfig
from .sections.frameworkcontroller import FrameworkControllerConfig
from .sections.kubeflow import KubeflowConfig
from .sections.local import LocalConfig
from .sections.openpai import OpenpaiConfig
from .sections.prefect_pool import PrefectPoolConfig
from .sections.remote import RemoteConfig
from .sections.slurm import SlurmConfig

PLATFORM_CONFIGS: dict[str, type[TrainingServiceConfig]] = {
    str(model.model_fields["platform"].default): model
    for model in (LocalConfig, RemoteConfig, OpenpaiConfig, AmlConfig, DlcConfig, KubeflowConfig,
                  FrameworkControllerConfig, AdlConfig, DltsConfig, PrefectPoolConfig, SlurmConfig)
}


def platform_tag(value: Any) -> str | None:
    """The platform name of a raw or parsed section (keys matched as NNI does; ``pai`` = openpai); a
    platform a plugin registered (``trialflow.config.plugins``) is tagged ``~plugin``."""
    if isinstance(value, dict):
        for key, tag in value.items():
            if canonical_key(str(key)) == "platform" and isinstance(tag, str):
                tag = tag.lower()
                return "~openpai" if tag == "pai" else _tag(tag)
        return None
    platform = getattr(value, "platform", None)
    return _tag(platform) if platform else None


def _tag(platform: str) -> str:
    if platform in PLATFORM_CONFIGS:
        return f"~{platform}"
    from .plugins import plugin_config

    return "~plugin" if plugin_config(platform) is not None else f"~{platform}"


def _plugin_section(value: Any) -> TrainingServiceConfig:
    """A plugin platform's section, validated by the plugin's own config model."""
    from .plugins import plugin_config

    if isinstance(value, TrainingServiceConfig):
        return value
    name = next(str(tag).lower() for key, tag in value.items() if canonical_key(str(key)) == "platform")
    model = plugin_config(name)
    assert model is not None  # the discriminator chose this branch because a plugin has the name
    return model.model_validate(value)  # type: ignore[return-value]


# Discriminator tags start with "~" so error paths can leave them out (trainingService.machineList[1].port).
if TYPE_CHECKING:
    AnyTrainingService = TrainingServiceConfig
else:
    AnyTrainingService = Annotated[
        Union[tuple([*(Annotated[model, Tag(f"~{name}")] for name, model in PLATFORM_CONFIGS.items()),  # noqa: UP007
                     Annotated[SerializeAsAny[TrainingServiceConfig], PlainValidator(_plugin_section),
                               Tag("~plugin")]])],
        Discriminator(
            platform_tag,
            custom_error_type="platform",
            custom_error_message="platform must be one of " + ", ".join(PLATFORM_CONFIGS),
        ),
    ]


class SharedStorageConfig(ConfigModel):
    storage_type: Literal["NFS", "AzureBlob"]
    local_mount_point: ConfigPath
    remote_mount_point: str
    local_mounted: Literal["usermount", "nnimount", "nomount"]
    nfs_server: str | None = None
    exported_directory: str | None = None
    storage_account_name: str | None = None
    storage_account_key: SecretStr | None = None
    container_name: str | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> SharedStorageConfig:
        if self.storage_type == "NFS" and not (self.nfs_server and self.exported_directory):
            raise ValueError("NFS shared storage needs nfsServer and exportedDirectory")
        if self.storage_type == "AzureBlob" and not (self.storage_account_name and self.container_name):
            raise ValueError("AzureBlob shared storage needs storageAccountName and containerName")
        return self


OneOrManyTrainingServices = Annotated[
    Annotated[AnyTrainingService, Tag("~one")] | Annotated[list[AnyTrainingService], Tag("~many")],
    Discriminator(lambda v: "~many" if isinstance(v, list) else "~one"),
]
