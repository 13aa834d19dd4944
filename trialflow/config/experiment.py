"""The experiment config (NNI v2 schema, docs/nni.md#experiment-config) and its loaders."""

from __future__ import annotations

import difflib
import json
import os
import warnings
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..assessors import ASSESSORS, MULTI_OBJECTIVE_ASSESSORS
from ..foundation.ids import looks_like_experiment_id
from ..records.search_space import SearchSpace, SearchSpaceError, parse_search_space
from ..tuners import MULTI_OBJECTIVE_NAMES, MULTI_OBJECTIVE_TUNERS, NAS_TUNERS, TUNERS
from ..tuners.custom import is_custom
from ..tuners.objectives import Objectives
from ..tuners.registry import registered, registered_algorithms
from ._base import (
    ConfigError,
    ConfigModel,
    ConfigPath,
    ConfigWarning,
    Duration,
    GpuIndices,
    base_dir_of,
    canonical_key,
    format_errors,
    resolve_against,
)
from .files import load_search_space_file, read_config_file
from .legacy import convert_v1, is_v1
from .platforms import OneOrManyTrainingServices, SharedStorageConfig, TrainingServiceConfig
from .tracking import TrackingConfig

# Top-level fields NNI copies into each training-service section that does not set them.
_SHORTCUTS = ("trialCommand", "trialCodeDirectory", "trialGpuNumber", "nniManagerIp", "debug")
DEFAULT_WORKING_DIRECTORY = "~/trialflow-experiments"
K8S_SHARING = ("kubeflow", "frameworkcontroller")  # their storage may come from an NFS sharedStorage


def warm_source(value: Any, base_dir: str | os.PathLike[str] | None = None) -> str:
    """A warm-start source as stored: an experiment id as written; a file's path resolved against
    ``base_dir`` (the config file's folder; None: the working directory), a file of an id's shape there
    winning. Raises ``ValueError`` for a value that is neither."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value).strip():
        raise ValueError("each warmStart entry is an experiment id or the path of an exported JSON file")
    path = resolve_against(value, base_dir)
    if looks_like_experiment_id(os.fspath(value)) and not path.is_file():
        return os.fspath(value)
    return str(path)


WarmStartSource = Annotated[str, BeforeValidator(lambda value, info: warm_source(value, base_dir_of(info)))]


class AlgorithmConfig(ConfigModel):
    """A tuner or assessor: a built-in ``name`` or a custom ``className`` (+ ``codeDirectory``)."""

    name: str | None = None
    class_name: str | None = None
    code_directory: ConfigPath | None = None
    class_args: dict[str, Any] = Field(default_factory=dict)

    @property
    def label(self) -> str:
        """How the algorithm is named: its built-in name, else its class name."""
        return self.name or self.class_name or ""

    @model_validator(mode="after")
    def _name_or_class(self) -> AlgorithmConfig:
        if (self.name is None) == (self.class_name is None):
            raise ValueError("set exactly one of name (built-in algorithm) or className (custom class)")
        if self.code_directory is not None and not self.code_directory.is_dir():
            raise ValueError(f'codeDirectory "{self.code_directory}" is not a directory')
        return self


class ObjectiveConfig(ConfigModel):
    """One objective of a multi-objective experiment: a key of the trial's final-result dict."""

    name: str = Field(min_length=1)
    direction: Literal["maximize", "minimize"]


class ConstraintConfig(ConfigModel):
    """A bound on a key of the final-result dict: a trial is feasible when every bound holds."""

    name: str = Field(min_length=1)
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _a_bound(self) -> ConstraintConfig:
        if self.min is None and self.max is None:
            raise ValueError(f"constraint {self.name!r} needs a min, a max or both, e.g. {{name: {self.name}, max: 8}}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"constraint {self.name!r}: min {self.min} is above max {self.max}")
        return self


class ExperimentConfig(ConfigModel):
    """A whole experiment. Build it with :func:`load_config` (file) or :func:`parse_config` (dict)."""

    experiment_name: str | None = None
    experiment_type: Literal["hpo"] = "hpo"
    search_space_file: ConfigPath | None = None
    search_space: Any = None
    trial_command: str | None = None
    trial_code_directory: ConfigPath | None = None
    trial_concurrency: int = Field(gt=0)
    trial_gpu_number: int | None = Field(default=None, ge=0)
    max_experiment_duration: Duration | None = Field(default=None, gt=0)
    max_trial_number: int | None = Field(default=None, gt=0)
    max_trial_duration: Duration | None = Field(default=None, gt=0)
    nni_manager_ip: str | None = None
    use_annotation: bool = False
    debug: bool = False
    log_level: Literal["fatal", "error", "warning", "info", "debug", "trace"] | None = None
    experiment_working_directory: ConfigPath = Field(  # TRIALFLOW_HOME, when set, is the default
        default_factory=lambda: os.environ.get("TRIALFLOW_HOME") or DEFAULT_WORKING_DIRECTORY, validate_default=True)
    tuner_gpu_indices: GpuIndices | None = None
    tuner: AlgorithmConfig | None = None
    assessor: AlgorithmConfig | None = None
    advisor: AlgorithmConfig | None = None
    objectives: list[ObjectiveConfig] | None = Field(
        default=None, description="several objectives (keys of the final-result dict) tuned at once")
    constraints: list[ConstraintConfig] | None = None
    training_service: OneOrManyTrainingServices
    warm_start: list[WarmStartSource] | None = Field(
        default=None, description="earlier experiments (their ids) or files of `trialflow experiment export "
        "--type json` whose finished trials this experiment's tuner learns from (as importData; not trials)")
    shared_storage: SharedStorageConfig | None = None
    tracking: TrackingConfig | None = None
    store_url: SecretStr | None = Field(
        default=None, description="URL of a shared experiment store, e.g. postgresql+psycopg://user@db.example.org/"
        "trialflow (pip install 'trialflow[postgres]'); default: embedded SQLite in the experiment directory")

    @model_validator(mode="before")
    @classmethod
    def _copy_shortcuts(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        top = {canonical_key(str(k)): v for k, v in data.items() if v is not None}
        out = dict(data)
        for key, value in data.items():
            if canonical_key(str(key)) != "trainingservice":
                continue
            sections = [cls._with_share_storage(cls._with_shortcuts(s, top), top.get("sharedstorage"))
                        for s in (value if isinstance(value, list) else [value])]
            out[key] = sections if isinstance(value, list) else sections[0]
        return out

    @staticmethod
    def _with_shortcuts(section: Any, top: dict[str, Any]) -> Any:
        if not isinstance(section, dict):
            return section
        present = {canonical_key(str(k)) for k, v in section.items() if v is not None}
        missing = {n: top[canonical_key(n)] for n in _SHORTCUTS
                   if canonical_key(n) in top and canonical_key(n) not in present}
        return {**section, **missing}

    @staticmethod
    def _with_share_storage(section: Any, share: Any) -> Any:
        """Kubeflow and FrameworkController sections without a ``storage`` use a top-level NFS
        sharedStorage as theirs: pods mount it at its remoteMountPoint."""
        if not isinstance(section, dict) or not isinstance(share, dict):
            return section
        keys = {canonical_key(str(k)) for k, v in section.items() if v is not None}
        if str(section.get("platform", "")).lower() not in K8S_SHARING or "storage" in keys:
            return section
        s = {canonical_key(str(k)): v for k, v in share.items()}
        if str(s.get("storagetype", "")).lower() != "nfs":
            raise ValueError(f"sharedStorage: {s.get('storagetype')} cannot be the storage of a "
                             f"{section.get('platform')} service; give its section a storage (azureStorage with "
                             "keyVault fields) or use an NFS sharedStorage")
        return {**section, "storage": {"storageType": "nfs", "server": s.get("nfsserver"),
                                       "path": s.get("exporteddirectory"), "localMountPoint": s.get("localmountpoint"),
                                       "containerMountPoint": s.get("remotemountpoint")}}

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _rules(self) -> ExperimentConfig:
        if self.use_annotation:
            raise ValueError("useAnnotation is not supported; write the search space in searchSpace or searchSpaceFile")
        if self.advisor is not None:
            if self.tuner is not None:
                raise ValueError('"advisor" is deprecated; set only "tuner"')
            warnings.warn('"advisor" is deprecated; it was moved to "tuner"', ConfigWarning, stacklevel=2)
            self.tuner, self.advisor = self.advisor, None
        if self.tuner is None:
            raise ValueError("tuner must be set (e.g. tuner: {name: TPE, classArgs: {optimize_mode: maximize}})")
        for kind, algorithm, builtin in (("tuner", self.tuner, TUNERS), ("assessor", self.assessor, ASSESSORS)):
            if algorithm is not None and algorithm.name is not None and algorithm.name.lower() not in builtin:
                _check_registered_name(kind, algorithm.name, builtin)
        if (self.search_space is None) == (self.search_space_file is None):
            raise ValueError("set exactly one of searchSpace or searchSpaceFile")
        if self.search_space_file is not None:
            self.search_space = load_search_space_file(self.search_space_file)
        if not self.custom_tuner:  # customized tuners define their own space formats (as NNI)
            try:
                parse_search_space(self.search_space)
            except SearchSpaceError as exc:
                raise ValueError(f"searchSpace: {exc}") from None
        if not self.search_space and not self.custom_tuner:  # NNI's ga_squad: {} "hard-coded in tuner"
            where = f'searchSpaceFile "{self.search_space_file}"' if self.search_space_file else "searchSpace"
            raise ValueError(f"{where} is empty: give at least one parameter, e.g. "
                             '{"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}}')
        if self.objectives is not None or self.constraints is not None:
            self._objective_rules()
        assessor = (self.assessor.name or "").lower() if self.assessor is not None else ""
        if assessor in MULTI_OBJECTIVE_ASSESSORS and not self.objectives:
            raise ValueError(f"assessor {self.assessor.name} ranks several objectives: list them in objectives, "  # type: ignore[union-attr]
                             "e.g. objectives: [{name: accuracy, direction: maximize}, {name: latency_ms, "
                             "direction: minimize}]")
        if self.is_hybrid:
            self._hybrid_rules()
        if self.shared_storage is not None:
            self._share_rules()
        if self.log_level is None:
            debug = self.debug or any(s.debug for s in self.services)
            self.log_level = "debug" if debug else "info"
        self._warn_unused()
        return self

    def _objective_rules(self) -> None:
        if not self.objectives:
            raise ValueError("constraints need objectives: list the keys of the final result to tune, e.g. "
                             "objectives: [{name: accuracy, direction: maximize}, {name: latency_ms, direction: "
                             "minimize}]")
        for what, names in (("objective", [o.name for o in self.objectives]),
                            ("constraint", [c.name for c in self.constraints or ()])):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{what} {twice[0]!r} is listed twice: give each {what} once")
        tuner = self.tuner
        if tuner is not None and not self.custom_tuner and (tuner.name or "").lower() not in MULTI_OBJECTIVE_TUNERS:
            raise ValueError(f"tuner {tuner.name} cannot tune several objectives or constraints; use one of "
                             f"{MULTI_OBJECTIVE_NAMES}, or a customized tuner")

    def _share_rules(self) -> None:
        if self.shared_storage.local_mounted == "nomount":  # type: ignore[union-attr]
            raise ValueError("sharedStorage.localMounted: nomount is not supported (NNI refuses it too): mount the "
                             "share yourself (usermount) or let trialflow mount it (nnimount)")
        share = self.shared_storage
        for i, service in enumerate(self.services):
            where = f"trainingService[{i}]" if self.is_hybrid else "trainingService"
            if service.platform in K8S_SHARING:
                storage = getattr(service, "storage", None)
                if (getattr(storage, "server", None), getattr(storage, "path", None)) != (
                        share.nfs_server, share.exported_directory):  # type: ignore[union-attr]
                    raise ValueError(f"{where}.storage and sharedStorage name different shares; remove one (without "
                                     "its own storage, the section uses sharedStorage)")
                continue
            if not service.shares_storage:
                raise ValueError(f"sharedStorage is used by the local, remote, kubeflow and frameworkcontroller "
                                 f"services; {where} ({service.platform}) keeps code and trials on its own storage: "
                                 "configure that in its section instead")
            service.shared_storage = self.shared_storage

    def _hybrid_rules(self) -> None:
        if not self.services:
            raise ValueError("trainingService: the list is empty; give at least one service section")
        for i, service in enumerate(self.services):
            if service.platform_concurrency is not None:
                raise ValueError(f"trainingService[{i}].platformConcurrency is not supported in a hybrid experiment; "
                                 "cap the service's share with maxConcurrency")

    def _warn_unused(self) -> None:
        """Fields NNI acts on that have no effect here: said, with the field's path, never ignored quietly."""
        if self.tuner_gpu_indices is not None:
            warnings.warn("tunerGpuIndices has no effect: the tuner runs inside the controller process, whose "
                          "GPUs are its CUDA_VISIBLE_DEVICES; set that variable where you start trialflow instead",
                          ConfigWarning, stacklevel=3)
        for i, service in enumerate(self.services):
            where = f"trainingService[{i}]" if self.is_hybrid else "trainingService"
            if not self.is_hybrid and (service.max_concurrency is not None or service.weight != 1.0):
                warnings.warn(f"{where}: maxConcurrency and weight only place trials between the services of a "
                              "hybrid experiment (a trainingService list); with one service they have no effect "
                              "(trialConcurrency caps the experiment)", ConfigWarning, stacklevel=3)
            if service.platform == "remote" and service.nni_manager_ip:
                warnings.warn(f"{where}.nniManagerIp has no effect on remote machines: trials' metrics come back "
                              "over SSH (SFTP), nothing on them connects to this machine", ConfigWarning, stacklevel=3)
            if getattr(service, "log_collection", "none") == "http":
                warnings.warn(f"{where}.logCollection: http is not needed: trialflow reads the trials' logs from "
                              "the shared NFS folder (`trialflow log trial`); the field has no effect",
                              ConfigWarning, stacklevel=3)

    def dump(self) -> dict[str, Any]:
        """As stored with an experiment: the search space's content, not the file it came from (the
        file may change or go; the stored copy must parse again on its own)."""
        data = super().dump()
        if self.search_space_file is not None:
            data.pop("searchSpaceFile", None)
        return data

    @property
    def custom_tuner(self) -> bool:
        """Whether the tuner is the user's own class (``className`` or a registered name)."""
        return self.tuner is not None and is_custom(self.tuner, TUNERS)

    def raw_values(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """What the tuner needs to be told of a trial with ``parameters`` that it did not suggest
        (import, hand-picked): the encoded internal values, or for a customized tuner the parameters."""
        if self.custom_tuner:
            return {"parameters": dict(parameters)}
        return self.space.encode(parameters)

    @property
    def multi_objective(self) -> Objectives | None:
        """The objectives and constraints; None for one objective (the final result, NNI's rule)."""
        return Objectives.of_config({"objectives": [o.model_dump() for o in self.objectives or ()],
                                     "constraints": [c.model_dump() for c in self.constraints or ()]})

    @property
    def services(self) -> list[TrainingServiceConfig]:
        ts = self.training_service
        return list(ts) if isinstance(ts, list) else [ts]

    @property
    def is_hybrid(self) -> bool:
        return isinstance(self.training_service, list)

    @property
    def space(self) -> SearchSpace:
        return parse_search_space(self.search_space)

    @property
    def name(self) -> str:
        return self.experiment_name or "experiment"


def _check_registered_name(kind: str, name: str, builtin: dict[str, Any]) -> None:
    entry = registered(name)
    if entry is not None:
        if entry.algo_type != kind:
            raise ValueError(f"{kind}.name: {name!r} is registered as a {entry.algo_type}, not a {kind}")
        return
    if kind == "tuner" and name.lower() in {n.lower() for n in NAS_TUNERS}:
        raise ValueError(f"{kind}.name: {name!r} is one of NNI's neural architecture search tuners; NAS is out "
                         "of trialflow's scope (it tunes hyperparameters: use TPE, BOHB, SMAC, ...)")
    names = list(builtin) + [a.builtin_name.lower() for a in registered_algorithms() if a.algo_type == kind]
    # compared without the kind's suffix ('MetisTuner' is 'metis'), and only a near spelling: a far one
    # (NoSuchTuner -> 'dngotuner') misleads more than none
    stems: dict[str, str] = {}
    for known in names:
        stems.setdefault(known.removesuffix(kind) or known, known)
    close = difflib.get_close_matches(name.lower().removesuffix(kind) or name.lower(), list(stems), n=1, cutoff=0.6)
    hint = f"; did you mean {stems[close[0]]!r}?" if close else ""
    raise ValueError(f"{kind}.name: unknown {kind} {name!r}{hint} (built-in: {', '.join(builtin)}; or give "
                     "className for your own, or register it with `trialflow algo register --meta`)")


def parse_config(data: Any, base_dir: str | os.PathLike[str] | None = None, source: str | None = None,
                 overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Validate a config mapping; relative paths resolve against ``base_dir`` (default: cwd).
    ``overrides`` (v2 field names) replace fields of the (v2, or converted) config before it is
    validated: a mapping given for a mapping field is merged into it, key by key."""
    if not isinstance(data, dict):
        raise ConfigError([f"the config must be a mapping of fields, got {type(data).__name__}"], source)
    if is_v1(data):
        data = convert_v1(data)
        warnings.warn("converted a legacy v1 (NNI 1.x/2.x) config to the v2 schema; "
                      "`trialflow config convert` prints the v2 equivalent", ConfigWarning, stacklevel=2)
    if overrides:
        if not isinstance(overrides, dict):
            raise ConfigError([f"overrides must be a mapping of config fields, got {type(overrides).__name__}"],
                              source)
        data = _merged(data, overrides)
        source = f"{source or 'the config'} with overrides {json.dumps(overrides, default=str)}"
    context = {"base_dir": os.fspath(base_dir) if base_dir is not None else os.getcwd()}
    try:
        return ExperimentConfig.model_validate(data, context=context)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc), source) from None


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load a YAML or JSON experiment config file (NNI v2, or v1 converted with a notice), with
    ``overrides`` as :func:`parse_config` applies them."""
    data, file = read_config_file(path)
    return parse_config(data, base_dir=file.parent, source=str(file), overrides=overrides)


def convert_config_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The v2 equivalent of an NNI v1 config file, checked by loading it (None: the file is v2)."""
    data, file = read_config_file(path)
    if not isinstance(data, dict) or not is_v1(data):
        return None
    converted = convert_v1(data)
    parse_config(converted, base_dir=file.parent, source=f"{file} converted to v2")
    return converted
