"""Per-platform ``trainingService`` sections of NNI's v2 config (reference docs/nni.md#platform-config-sections).

Every section parses and validates here, whether or not its training service is implemented yet;
the registry in ``trialflow.platforms`` says which ones can run.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    Discriminator,
    Field,
    PlainValidator,
    SecretStr,
    SerializeAsAny,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from ._base import ConfigModel, ConfigPath, GpuIndices, SizeMB, canonical_key, resolve_path

DEFAULT_IMAGE = "msranni/nni:latest"


class TrainingServiceConfig(ConfigModel):
    """Fields every platform shares; top-level shortcut fields are copied in when missing."""

    platform: str
    trial_command: str = ""
    trial_code_directory: ConfigPath = Field(default=None, validate_default=True)  # type: ignore[assignment]
    trial_gpu_number: int | None = Field(default=None, ge=0)
    nni_manager_ip: str | None = None
    debug: bool = False
    reuse_mode: bool = False
    platform_concurrency: int | None = Field(
        default=None, gt=0, description="at most this many trials of this platform run together across every "
        "experiment using the same Prefect server (a Prefect global concurrency limit)")
    max_concurrency: int | None = Field(
        default=None, gt=0, description="hybrid experiments: at most this many of the experiment's trials run on "
        "this service (default: trialConcurrency)")
    weight: float = Field(default=1.0, gt=0, description="hybrid experiments: this service's share of new trials "
                          "scales with weight x free slots")
    platform_concurrency_name: str | None = Field(
        default=None, min_length=1, description="name of that limit (default: trialflow-<platform>); experiments "
        "naming the same limit share its slots")
    max_interruptions: int = Field(
        default=3, ge=0, description="how many times a trial is resubmitted with the same parameters after an "
        "infrastructure event ended its run (preemption, node failure, a requeue); these are not trial failures "
        "and are counted apart (platforms that report them: docs/platforms.md#interruptions)")

    # the experiment's top-level sharedStorage, set on each section when the config loads
    shared_storage: Any = Field(default=None, exclude=True)
    shares_storage: ClassVar[bool] = False  # whether the service uses top-level sharedStorage

    @property
    def cap_name(self) -> str:
        return self.platform_concurrency_name or f"trialflow-{self.platform}"

    # Kubeflow and FrameworkController roles carry their own commands (NNI sets trialCommand to '')
    roles_carry_commands: ClassVar[bool] = False

    @model_validator(mode="after")
    def _command_where_used(self) -> TrainingServiceConfig:
        if self.trial_command.strip():
            return self
        if not self.roles_carry_commands:
            raise ValueError("trialCommand is required: the command that runs one trial, e.g. python3 mnist.py")
        if self.reuse_mode and "reuse_mode" in self.model_fields_set:
            raise ValueError("trialCommand is required with reuseMode: true (each environment runs it for every "
                             "trial; the roles' commands are used only with reuseMode: false)")
        if self.reuse_mode:  # NNI's own role-only configs: run them as NNI does, one job per trial
            warnings.warn("no trialCommand: each trial runs the roles' commands in a job of its own (reuseMode: "
                          "false); set trialCommand to reuse environments between trials", stacklevel=2)
            self.reuse_mode = False
        return self

    @field_validator("trial_code_directory", mode="before")
    @classmethod
    def _default_code_dir(cls, value: Any) -> Any:
        return "." if value is None else value

    @field_validator("trial_code_directory")
    @classmethod
    def _code_dir_exists(cls, value: Any) -> Any:
        if not value.is_dir():
            raise ValueError(f'"{value}" is not a directory; set trialCodeDirectory to the folder of your trial code')
        return value


class LocalConfig(TrainingServiceConfig):
    platform: Literal["local"] = "local"
    shares_storage: ClassVar[bool] = True
    use_active_gpu: bool | None = None
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    gpu_indices: GpuIndices | None = None

    @model_validator(mode="after")
    def _gpu_rules(self) -> LocalConfig:
        self.nni_manager_ip = None
        if self.reuse_mode:
            raise ValueError("reuseMode: true is not available on local (NNI 3.0 fails on it too): local trials "
                             "already start from a warm fork server, with no per-trial environment to keep; "
                             "remove reuseMode")
        if self.trial_gpu_number and self.use_active_gpu is None:
            raise ValueError(
                "useActiveGpu must be set when trialGpuNumber > 0: true if your system has a GUI, "
                "false if the machine runs several experiments concurrently"
            )
        if self.max_trial_number_per_gpu != 1 and self.trial_gpu_number is None:
            raise ValueError("maxTrialNumberPerGpu does not work without trialGpuNumber; set trialGpuNumber")
        return self


class RemoteMachineConfig(ConfigModel):
    host: str = Field(min_length=1)
    port: int = Field(default=22, gt=0, lt=65536)
    user: str | None = None
    password: SecretStr | None = None
    ssh_key_file: ConfigPath | None = None
    ssh_passphrase: SecretStr | None = None
    credentials: str | None = Field(default=None, description="name of a trialflow SSH credentials block")
    use_active_gpu: bool = False
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    gpu_indices: GpuIndices | None = None
    python_path: str | None = None
    remote_working_directory: str = Field(
        default="~/trialflow-experiments", min_length=1,
        description="where code bundles, the trial runtime and trial directories live on the machine")

    @model_validator(mode="after")
    def _auth(self) -> RemoteMachineConfig:
        if self.credentials:
            return self
        if not self.user:
            raise ValueError("user is required (or name a credentials block with 'credentials')")
        if self.password is not None:
            self.ssh_key_file = None
            return self
        key = self.ssh_key_file or resolve_path("~/.ssh/id_rsa", None)
        if not key.is_file():
            raise ValueError(f'provide a password or a valid SSH key file: sshKeyFile "{key}" is not a file')
        self.ssh_key_file = key
        return self


class RemoteConfig(TrainingServiceConfig):
    platform: Literal["remote"] = "remote"
    shares_storage: ClassVar[bool] = True
    machine_list: list[RemoteMachineConfig] = Field(min_length=1)
    trust_unknown_hosts: bool = Field(default=False, description="trust SSH host keys on first use")
    known_hosts_file: ConfigPath = Field(default="~/.ssh/known_hosts", validate_default=True,  # type: ignore[assignment]
                                         description="OpenSSH known_hosts file checked (and, on first use, extended)")

    @model_validator(mode="after")
    def _per_gpu(self) -> RemoteConfig:
        if self.trial_gpu_number is None and any(m.max_trial_number_per_gpu != 1 for m in self.machine_list):
            raise ValueError("maxTrialNumberPerGpu does not work without trialGpuNumber; set trialGpuNumber")
        return self


_LOCAL_MOUNT = ("where this machine sees the shared storage (mounted by you); trialflow copies the code, the "
                "trial runtime and trial files there and reads results back")
MetricChannel = Literal["http", "logs", "file"]
_METRIC_CHANNEL = ("how trial metrics come back: http (pushed to this controller's receiver; pod logs are the "
                   "fallback), logs (marker lines read from pod logs only) or file (read from the shared storage)")


_SHARE_CHANNEL = ("how trial metrics come back: http (pushed to this controller's receiver; the trial's stdout on "
                  "the shared storage is the fallback), logs (marker lines of the trial's stdout on the shared "
                  "storage only) or file (a metrics file on the shared storage)")


class OpenpaiConfig(TrainingServiceConfig):
    platform: Literal["openpai"] = "openpai"
    host: str = Field(description="the cluster's address: its web portal (pylon, /rest-server/ is added) or the "
                                  "REST server itself; https:// is added when no scheme is given")
    username: str | None = Field(default=None, description="OpenPAI user the jobs belong to (or the block's)")
    token: SecretStr | None = Field(default=None, description="the user's application token (or a block's)")
    credentials: str | None = Field(default=None, description="name of a trialflow OpenPAI credentials block "
                                                              "(username and token, instead of writing them here)")
    trial_cpu_number: int = Field(gt=0)
    trial_memory_size: SizeMB
    storage_config_name: str = Field(min_length=1)
    docker_image: str = DEFAULT_IMAGE
    virtual_cluster: str | None = None
    local_storage_mount_point: ConfigPath = Field(description=_LOCAL_MOUNT)
    container_storage_mount_point: str = Field(min_length=1, description="where jobs' containers see that storage "
                                                                         "(OpenPAI mounts it at /mnt/<name>)")
    reuse_mode: bool = True
    openpai_config: dict[str, Any] | None = None
    openpai_config_file: ConfigPath | None = None
    verify_tls: bool = Field(default=True, description="check the server's TLS certificate (false only for a "
                                                       "self-signed test cluster; a warning is logged)")
    ca_bundle: ConfigPath | None = Field(default=None, description="CA bundle (PEM) of a private certificate "
                                                                   "authority to verify the server with")
    metric_channel: MetricChannel = Field(default="http", description=_SHARE_CHANNEL)
    job_priority_class: Literal["crit", "prod", "test", "oppo"] | None = Field(
        default=None, description="the hived scheduler's priority class of the jobs "
        "(extras.hivedScheduler.jobPriorityClass): oppo runs on idle capacity that other jobs preempt, each "
        "preemption an interruption")

    @field_validator("host")
    @classmethod
    def _scheme(cls, value: str) -> str:
        return (value if "://" in value else f"https://{value}").rstrip("/")

    @model_validator(mode="after")
    def _rules(self) -> OpenpaiConfig:
        if self.trial_gpu_number is None:
            raise ValueError("trialGpuNumber must be set for openpai (0 for CPU-only trials)")
        if not self.local_storage_mount_point.is_dir():
            raise ValueError(f'localStorageMountPoint "{self.local_storage_mount_point}" is not a directory')
        if self.openpai_config is not None and self.openpai_config_file is not None:
            raise ValueError("openpaiConfig and openpaiConfigFile can only be set one")
        if self.openpai_config_file is not None and not self.openpai_config_file.is_file():
            raise ValueError(f'openpaiConfigFile "{self.openpai_config_file}" is not a file')
        if self.ca_bundle is not None and not self.ca_bundle.is_file():
            raise ValueError(f'caBundle "{self.ca_bundle}" is not a file')
        if not self.credentials and (not self.username or self.token is None):
            raise ValueError("username and token are required (or name an OpenPAI credentials block with "
                             "'credentials')")
        return self

    def protocol_template(self) -> dict[str, Any] | None:
        """The user's job protocol (openpaiConfig, or openpaiConfigFile read), or None."""
        if self.openpai_config_file is not None:
            loaded = yaml.safe_load(self.openpai_config_file.read_text())
            if not isinstance(loaded, dict):
                raise ValueError(f'openpaiConfigFile "{self.openpai_config_file}" is not a job protocol mapping')
            return loaded
        return self.openpai_config


class AmlConfig(TrainingServiceConfig):
    """NNI's ``aml`` section plus a credentials block and the datastore jobs mount: code, the trial
    runtime and trial files live on that datastore (``localStorageMountPoint`` is where this machine
    sees its file share or blob container), so no code upload to Azure Storage is needed."""

    platform: Literal["aml"] = "aml"
    subscription_id: str
    resource_group: str
    workspace_name: str
    compute_target: str
    docker_image: str = DEFAULT_IMAGE
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    credentials: str | None = Field(default=None, description="name of a trialflow Azure ML credentials block "
                                                              "(default: azure-identity's DefaultAzureCredential)")
    datastore: str = Field(default="workspaceworkingdirectory", min_length=1,
                           description="the workspace datastore jobs mount read-write (an Azure file share or blob "
                                       "container this machine also mounts)")
    datastore_path: str = Field(default="", description="folder inside the datastore")
    local_storage_mount_point: ConfigPath | None = Field(default=None, description=_LOCAL_MOUNT + "; required to run")
    reuse_mode: bool = True
    metric_channel: MetricChannel = Field(default="http", description=_SHARE_CHANNEL)
    job_tier: Literal["Spot", "Basic", "Standard", "Premium"] | None = Field(
        default=None, description="the jobs' tier (queue settings): Spot runs on capacity Azure may preempt, each "
        "preemption an interruption (so is one on a low-priority compute cluster)")


class DlcConfig(TrainingServiceConfig):
    """NNI's ``dlc`` section plus a credentials block, an endpoint override and the metric channel.
    Jobs mount the NAS data source at ``containerStorageMountPoint``; this machine sees the same NAS
    at ``localStorageMountPoint``."""

    platform: Literal["dlc"] = "dlc"
    type: str = Field(default="Worker", description="the job spec's role (Worker, Master, Chief, ...)")
    image: str
    job_type: Literal["TFJob", "PyTorchJob"] = "TFJob"
    pod_count: int = Field(default=1, gt=0)
    ecs_spec: str
    region: str = Field(description="region id, e.g. cn-hangzhou ('share' is NNI's shared endpoint)")
    workspace_id: str | None = None
    nas_data_source_id: str
    oss_data_source_id: str | None = None
    access_key_id: SecretStr | None = None
    access_key_secret: SecretStr | None = None
    credentials: str | None = Field(default=None, description="name of a trialflow PAI-DLC credentials block "
                                                              "(the AccessKey pair, instead of writing it here)")
    endpoint: str | None = Field(default=None, description="API endpoint override (default pai-dlc.<region>."
                                                           "aliyuncs.com; http://host:port for plain HTTP)")
    local_storage_mount_point: ConfigPath = Field(description=_LOCAL_MOUNT)
    container_storage_mount_point: str = Field(min_length=1, description="where jobs mount the NAS data source")
    reuse_mode: bool = True
    metric_channel: MetricChannel = Field(default="http", description=_SHARE_CHANNEL)
    spot_discount_limit: float | None = Field(
        default=None, gt=0, le=1, description="run the pods on spot instances at up to this share of the "
        "on-demand price (SpotSpec SpotWithPriceLimit, e.g. 0.5); a reclaimed instance is an interruption")

    @field_validator("pod_count", mode="before")
    @classmethod
    def _pod_count_text(cls, value: Any) -> Any:
        return int(value) if isinstance(value, str) and value.strip().isdigit() else value

    @field_validator("workspace_id")
    @classmethod
    def _none_text(cls, value: str | None) -> str | None:
        return None if value == "None" else value

    @model_validator(mode="after")
    def _rules(self) -> DlcConfig:
        if not self.credentials and (self.access_key_id is None or self.access_key_secret is None):
            raise ValueError("accessKeyId and accessKeySecret are required (or name a PAI-DLC credentials block "
                             "with 'credentials')")
        return self  # the NAS mount is checked at start, where it must be mounted


class NfsStorage(ConfigModel):
    storage_type: Literal["nfs"] = "nfs"
    server: str
    path: str
    local_mount_point: ConfigPath | None = Field(default=None, description=_LOCAL_MOUNT)
    container_mount_point: str | None = Field(default=None, description="where pods mount it (default /tmp/mount; "
                                              "a top-level sharedStorage's remoteMountPoint)")


class AzureStorage(ConfigModel):
    storage_type: Literal["azureStorage"] = "azureStorage"
    azure_account: str
    azure_share: str
    key_vault_name: str
    key_vault_key: str
    local_mount_point: ConfigPath | None = Field(default=None, description=_LOCAL_MOUNT)


class PvcStorage(ConfigModel):
    """A PersistentVolumeClaim (NNI's ``storage: pvc``, FrameworkController only): ``path`` is where
    this machine sees the claim's volume; pods mount it at the container mount point, through
    ``claimName`` or through a custom Framework template (``configPath``) that mounts it itself."""

    storage_type: Literal["pvc"] = "pvc"
    path: ConfigPath = Field(description="where this machine sees the claim's volume (NNI's pvc.path)")
    claim_name: str | None = Field(default=None, description="the claim trialflow mounts in the pods; leave it "
                                   "out when the configPath template mounts the volume itself")

    @property
    def local_mount_point(self) -> Any:
        return self.path


def _storage_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        for key, tag in value.items():
            if canonical_key(str(key)) == "storagetype":
                return {"nfs": "~nfs", "azurestorage": "~azureStorage", "pvc": "~pvc"}.get(str(tag).lower(), str(tag))
        return "~nfs"
    kind = getattr(value, "storage_type", None)
    return f"~{kind}" if kind else None


K8sStorageConfig = Annotated[
    Annotated[NfsStorage, Tag("~nfs")] | Annotated[AzureStorage, Tag("~azureStorage")],
    Discriminator(
        _storage_tag,
        custom_error_type="storage_type",
        custom_error_message='storageType must be "nfs" or "azureStorage"',
    ),
]
FrameworkStorageConfig = Annotated[
    Annotated[NfsStorage, Tag("~nfs")] | Annotated[AzureStorage, Tag("~azureStorage")]
    | Annotated[PvcStorage, Tag("~pvc")],
    Discriminator(
        _storage_tag,
        custom_error_type="storage_type",
        custom_error_message='storageType must be "nfs", "azureStorage" or "pvc"',
    ),
]


TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


class KubernetesCapacity(ConfigModel):
    """Where a Kubernetes section's pods may run and how readily they yield, in Kubernetes' own terms:
    cheap capacity. A pod on it that is preempted or evicted is an interruption (``maxInterruptions``),
    not the trial's failure."""

    priority_class_name: str | None = Field(
        default=None, min_length=1, description="the pods' PriorityClass: a low one lets higher-priority pods "
        "preempt trials, each preemption an interruption")
    tolerations: list[dict[str, Any]] | None = Field(
        default=None, description="the pods' tolerations, e.g. of a spot node pool's taint "
        "({key: ..., operator: Exists, effect: NoSchedule})")
    node_selector: dict[str, str] | None = Field(default=None, description="node labels the pods must run on "
                                                                           "(e.g. a spot node pool's)")

    @field_validator("tolerations")
    @classmethod
    def _toleration_keys(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, toleration in enumerate(value or []):
            unknown = sorted(set(toleration) - TOLERATION_KEYS)
            if unknown:
                raise ValueError(f"tolerations[{i}] has {', '.join(unknown)}; a toleration takes "
                                 f"{', '.join(sorted(TOLERATION_KEYS))}")
        return value

    def pod_capacity(self) -> dict[str, Any]:
        """The pod spec fields these settings give (none when unset)."""
        fields = {"priorityClassName": self.priority_class_name, "tolerations": self.tolerations,
                  "nodeSelector": self.node_selector}
        return {k: v for k, v in fields.items() if v is not None}


class KubeflowRoleConfig(ConfigModel):
    replicas: int = Field(gt=0)
    command: str
    gpu_number: int = Field(default=0, ge=0)
    cpu_number: float = Field(gt=0)
    memory_size: SizeMB
    docker_image: str = DEFAULT_IMAGE
    code_directory: str | None = None
    private_registry_auth_path: ConfigPath | None = None


class KubeflowConfig(TrainingServiceConfig, KubernetesCapacity):
    platform: Literal["kubeflow"] = "kubeflow"
    roles_carry_commands: ClassVar[bool] = True
    operator: Literal["tf-operator", "pytorch-operator"]
    api_version: Literal["v1alpha2", "v1beta1", "v1beta2", "v1"]
    storage: K8sStorageConfig
    worker: KubeflowRoleConfig | None = None
    ps: KubeflowRoleConfig | None = None
    master: KubeflowRoleConfig | None = None
    reuse_mode: bool = True
    namespace: str = "default"
    credentials: str | None = Field(default=None, description="name of a Kubernetes credentials block")
    metric_channel: MetricChannel = Field(default="http", description=_METRIC_CHANNEL)

    @model_validator(mode="after")
    def _roles(self) -> KubeflowConfig:
        if self.worker is None:
            raise ValueError("worker must be set (the replica spec that runs the trial)")
        if self.operator == "tf-operator" and self.master is not None:
            raise ValueError("tf-operator takes worker and ps roles, not master")
        if self.operator == "pytorch-operator":
            if self.ps is not None:
                raise ValueError("pytorch-operator takes master and worker roles, not ps")
            if self.master is not None and self.master.replicas != 1:
                raise ValueError("pytorch-operator needs exactly one master replica")
        return self


class CompletionPolicy(ConfigModel):
    min_failed_task_count: int
    min_succeed_task_count: int


class FrameworkControllerRoleConfig(ConfigModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    docker_image: str = DEFAULT_IMAGE
    task_number: int = Field(gt=0)
    command: str
    gpu_number: int = Field(ge=0)
    cpu_number: float = Field(gt=0)
    memory_size: SizeMB
    framework_attempt_completion_policy: CompletionPolicy
    private_registry_auth_path: ConfigPath | None = None


class FrameworkControllerConfig(TrainingServiceConfig, KubernetesCapacity):
    platform: Literal["frameworkcontroller"] = "frameworkcontroller"
    roles_carry_commands: ClassVar[bool] = True
    storage: FrameworkStorageConfig
    service_account_name: str | None = None
    task_roles: list[FrameworkControllerRoleConfig] = Field(default_factory=list)
    config_path: ConfigPath | None = Field(default=None, description="a Framework YAML to use as the job's template "
                                           "(NNI's frameworkcontrollerConfig.configPath): its task roles, images, "
                                           "resources and volumes are kept; trialflow sets names, labels, "
                                           "commands and its share")
    reuse_mode: bool = True
    namespace: str = "default"
    credentials: str | None = Field(default=None, description="name of a Kubernetes credentials block")
    metric_channel: MetricChannel = Field(default="http", description=_METRIC_CHANNEL)

    @model_validator(mode="after")
    def _roles_or_template(self) -> FrameworkControllerConfig:
        if self.config_path is None:
            if not self.task_roles:
                raise ValueError("taskRoles needs at least one role (or give configPath: a Framework template)")
            if self.storage.storage_type == "pvc" and not self.storage.claim_name:
                raise ValueError("pvc storage needs claimName (the claim trialflow mounts in the pods), or a "
                                 "configPath template that mounts it")
            return self
        if self.task_roles:
            raise ValueError("give taskRoles or configPath (a Framework template), not both")
        if self.reuse_mode:
            raise ValueError("configPath (a custom Framework template) works with reuseMode: false, as in NNI")
        self.template_roles()  # the template is checked when the config is loaded
        return self

    def template_roles(self) -> list[dict[str, Any]]:
        """The task roles of the ``configPath`` template, checked: a Framework with task roles of one
        (non-init) container each that has a command."""
        assert self.config_path is not None
        path = Path(self.config_path)
        try:
            template = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f'configPath "{path}" cannot be read as YAML: {exc}') from None
        if not isinstance(template, dict) or template.get("kind") != "Framework":
            raise ValueError(f'configPath "{path}" is not a Framework (kind: Framework)')
        roles = (template.get("spec") or {}).get("taskRoles") or []
        if not roles:
            raise ValueError(f'configPath "{path}": spec.taskRoles has no role')
        for i, role in enumerate(roles):
            containers = ((((role or {}).get("task") or {}).get("pod") or {}).get("spec") or {}).get("containers")
            if not role.get("name") or not isinstance(containers, list) or len(containers) != 1:
                raise ValueError(f'configPath "{path}": spec.taskRoles[{i}] needs a name and exactly one container '
                                 "in task.pod.spec.containers")
            if not containers[0].get("command"):
                raise ValueError(f'configPath "{path}": spec.taskRoles[{i}] ({role["name"]}): its container has no '
                                 "command")
        return [dict(r) for r in roles]


class AdlNfs(ConfigModel):
    server: str
    path: str
    container_mount_path: str
    local_mount_point: ConfigPath | None = Field(default=None, description=_LOCAL_MOUNT)


class AdlCheckpoint(ConfigModel):
    storage_class: str
    storage_size: str


class AdlConfig(TrainingServiceConfig, KubernetesCapacity):
    """AdaptDL; NNI only accepted it through v1 files, trialflow also takes it as a v2 section."""

    platform: Literal["adl"] = "adl"
    image: str = DEFAULT_IMAGE
    namespace: str = "default"
    image_pull_secrets: list[dict[str, str]] | None = None
    nfs: AdlNfs | None = None
    adaptive: bool = False
    checkpoint: AdlCheckpoint | None = None
    cpu_number: float | None = Field(default=None, gt=0)
    memory_size: str | None = None
    log_collection: Literal["http", "none"] = "none"
    credentials: str | None = Field(default=None, description="name of a Kubernetes credentials block")
    metric_channel: MetricChannel = Field(default="http", description=_METRIC_CHANNEL)


class DltsConfig(TrainingServiceConfig):
    """NNI's v1 ``dltsConfig`` (dashboard, cluster, team, email, password, gpuType, image) plus where
    the cluster's shared work directory is seen here and in jobs (NNI's manager ran inside a DLTS job,
    where both are the same path)."""

    platform: Literal["dlts"] = "dlts"
    dashboard: str = Field(description="the cluster's dashboard URL (the API is under <dashboard>api/)")
    cluster: str = ".default"
    team: str | None = Field(default=None, description="team (virtual cluster); default $DLWS_VC_NAME")
    email: str | None = Field(default=None, description="your dashboard e-mail; default $DLWS_USER_EMAIL")
    password: SecretStr | None = Field(default=None, description="your dashboard password or token; default "
                                                                 "$DLTS_JOB_TOKEN")
    credentials: str | None = Field(default=None, description="name of a trialflow DLTS credentials block")
    gpu_type: str | None = Field(default=None, description="GPU type of the jobs; fetched from the team's cluster "
                                                           "when not set")
    image: str = DEFAULT_IMAGE
    local_storage_mount_point: ConfigPath = Field(default="~", validate_default=True,  # type: ignore[assignment]
                                                  description=_LOCAL_MOUNT)
    container_storage_mount_point: str | None = Field(default=None, description="where jobs see that work directory "
                                                      "(default: the same path as here)")
    verify_tls: bool = True
    ca_bundle: ConfigPath | None = None
    metric_channel: MetricChannel = Field(default="http", description=_SHARE_CHANNEL)
    preemptible: bool = Field(default=False, description="let the cluster pause the jobs for other work "
                              "(preemptionAllowed): cheap capacity; each pause is an interruption")

    @field_validator("dashboard")
    @classmethod
    def _slash(cls, value: str) -> str:
        value = value if "://" in value else f"https://{value}"
        return value if value.endswith("/") else value + "/"

    @model_validator(mode="after")
    def _defaults(self) -> DltsConfig:
        self.team = self.team or os.environ.get("DLWS_VC_NAME") or None
        self.email = self.email or os.environ.get("DLWS_USER_EMAIL") or None
        if self.password is None and os.environ.get("DLTS_JOB_TOKEN"):
            self.password = SecretStr(os.environ["DLTS_JOB_TOKEN"])
        if not self.credentials and (not self.email or self.password is None):
            raise ValueError("email and password are required (or $DLWS_USER_EMAIL and $DLTS_JOB_TOKEN, or a DLTS "
                             "credentials block named with 'credentials')")
        if not self.local_storage_mount_point.is_dir():
            raise ValueError(f'localStorageMountPoint "{self.local_storage_mount_point}" is not a directory')
        if self.container_storage_mount_point is None:
            self.container_storage_mount_point = str(self.local_storage_mount_point)
        return self


class PrefectPoolConfig(TrainingServiceConfig):
    """Any Prefect work pool as the platform: each trial (or reuse environment) is a flow run of
    trialflow's trial-runner flow on ``workPool``. The shared storage is a folder this machine sees at
    ``localStorageMountPoint`` and the pool's workers at ``containerStorageMountPoint``."""

    platform: Literal["prefect"] = "prefect"
    work_pool: str = Field(min_length=1, description="the Prefect work pool the trials run on")
    job_variables: dict[str, Any] = Field(default_factory=dict, description="the pool's job variables for every "
                                          "trial's flow run (image, env, cpu/memory where the pool type has them)")
    deployment: str | None = Field(default=None, description="an existing deployment of trialflow's trial-runner "
                                   "flow ('trialflow-trial/<name>'); default: one deployed per experiment")
    local_storage_mount_point: ConfigPath | None = Field(default=None, description="where this machine sees the "
                                                         "shared storage (default: beside the experiment folders)")
    container_storage_mount_point: str | None = Field(default=None, description="where the pool's workers see it "
                                                      "(default: the same path)")
    metric_channel: MetricChannel = Field(default="http", description=_SHARE_CHANNEL)


_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
_SLURM_OWN_OPTIONS = ("--job-name", "-J", "--output", "-o", "--error", "-e", "--parsable", "--open-mode", "--chdir",
                      "-D", "--wrap")


class SlurmConfig(TrainingServiceConfig):
    """A Slurm cluster: each trial a batch job (``reuseMode: true``: jobs that host trial after trial).
    Without ``host`` this machine is a login node; with ``host`` the controller reaches one over SSH
    (the remote platform's fields: ``user``, ``sshKeyFile`` or ``password``, or a ``credentials`` block)."""

    platform: Literal["slurm"] = "slurm"
    host: str | None = Field(default=None, min_length=1, description="a login node reached over SSH (default: "
                             "this machine is one)")
    port: int = Field(default=22, gt=0, lt=65536)
    user: str | None = None
    password: SecretStr | None = None
    ssh_key_file: ConfigPath | None = None
    ssh_passphrase: SecretStr | None = None
    credentials: str | None = Field(default=None, description="name of a trialflow SSH credentials block")
    trust_unknown_hosts: bool = Field(default=False, description="trust SSH host keys on first use")
    known_hosts_file: ConfigPath = Field(default="~/.ssh/known_hosts", validate_default=True,  # type: ignore[assignment]
                                         description="OpenSSH known_hosts file checked (and, on first use, extended)")
    python_path: str | None = Field(default=None, description="folder of the python3 the login and compute nodes "
                                    "run the trial runtime with")
    remote_working_directory: str = Field(
        default="~/trialflow-experiments", min_length=1,
        description="a folder on the cluster's shared filesystem (same path on every node) for code, the trial "
        "runtime and trial directories")
    login_command: str | None = Field(default=None, description="shell lines run before each Slurm command on the "
                                      "login node (module load slurm; export SLURM_CONF=...)")
    prepare_command: str | None = Field(default=None, description="shell lines each job runs before the trial "
                                        "(module load, conda activate)")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = Field(default=None, description="each job's --time (minutes, HH:MM:SS, D-HH:MM...)")
    gpus_per_trial: int | None = Field(default=None, ge=0, description="GPUs per job (--gres=gpu:N; default "
                                       "trialGpuNumber)")
    cpus_per_trial: int = Field(default=1, gt=0, description="--cpus-per-task of each job")
    memory: str | None = Field(default=None, description="--mem of each job, e.g. 8G")
    sbatch_options: list[str] = Field(default_factory=list, description="more sbatch options, one per item "
                                      "(--constraint=a100)")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        value = str(value) if isinstance(value, int) else value
        if isinstance(value, str) and not _SLURM_TIME.match(value.strip()):
            raise ValueError(f"timeLimit {value!r} is not a Slurm time: use minutes, HH:MM:SS or D-HH:MM:SS")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d+[KMGT]?", value.strip()):
            raise ValueError(f"memory {value!r} is not a Slurm size: use a number with K, M, G or T, e.g. 16G")
        return value.strip() if value else value

    @field_validator("sbatch_options")
    @classmethod
    def _own_options(cls, value: list[str]) -> list[str]:
        for option in value:
            if option.split("=")[0].strip() in _SLURM_OWN_OPTIONS:
                raise ValueError(f"sbatchOptions: {option!r} is set by trialflow for each job; remove it")
        return value

    @model_validator(mode="after")
    def _login(self) -> SlurmConfig:
        if self.host:
            self.login_machine()
        return self

    def login_machine(self) -> RemoteMachineConfig:
        """The login node as a remote machine (``host`` given). Raises ValueError naming what is wrong."""
        fields = {"host": self.host, "port": self.port, "user": self.user, "password": self.password,
                  "ssh_key_file": self.ssh_key_file, "ssh_passphrase": self.ssh_passphrase,
                  "credentials": self.credentials, "python_path": self.python_path,
                  "remote_working_directory": self.remote_working_directory}
        try:
            return RemoteMachineConfig.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None


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
