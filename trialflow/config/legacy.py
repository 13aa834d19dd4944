"""Conversion of legacy v1 experiment configs (NNI 1.x/2.x ``trainingServicePlatform`` files) to v2.

Mirrors NNI's ``nni/experiment/config/convert.py`` plus the v1-only platforms (adl, dlts). Keys are
matched case- and underscore-insensitively like the rest of the config.
"""

from __future__ import annotations

import warnings
from typing import Any

from ._base import ConfigWarning, canonical_key

_V1_MARKERS = {"authorname", "trainingserviceplatform", "trial", "maxexecduration", "maxtrialnum",
               "searchspacepath", "localconfig", "machinelist", "paiconfig", "kubeflowconfig",
               "frameworkcontrollerconfig", "dltsconfig", "remoteconfig"}


def is_v1(data: dict[str, Any]) -> bool:
    return any(canonical_key(str(k)) in _V1_MARKERS for k in data)


def _ci(data: Any) -> dict[str, Any]:
    return {canonical_key(str(k)): v for k, v in data.items()} if isinstance(data, dict) else {}


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


def _algorithm(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    a = _ci(raw)
    out: dict[str, Any] = {}
    _put(out, "name", a.get("builtintunername") or a.get("builtinassessorname") or a.get("builtinadvisorname"))
    class_name, class_file = a.get("classname"), a.get("classfilename")
    if class_name and class_file:  # v1 names the file and the class apart: my_tuner.py + MyTuner
        class_name = f"{str(class_file).removesuffix('.py').replace('/', '.')}.{class_name}"
    _put(out, "className", class_name)
    _put(out, "codeDirectory", a.get("codedir"))
    _put(out, "classArgs", a.get("classargs"))
    return out


def _machine(raw: Any) -> dict[str, Any]:
    m = _ci(raw)
    out: dict[str, Any] = {}
    for old, new in (("ip", "host"), ("port", "port"), ("username", "user"), ("passwd", "password"),
                     ("sshkeypath", "sshKeyFile"), ("passphrase", "sshPassphrase"), ("gpuindices", "gpuIndices"),
                     ("maxtrialnumpergpu", "maxTrialNumberPerGpu"), ("useactivegpu", "useActiveGpu"),
                     ("pythonpath", "pythonPath")):
        _put(out, new, m.get(old))
    return out


def _k8s_storage(cfg: dict[str, Any]) -> dict[str, Any]:
    if str(cfg.get("storage") or "").lower() == "pvc":
        return {"storageType": "pvc", "path": _ci(cfg.get("pvc")).get("path")}
    if "nfs" in cfg:
        nfs = _ci(cfg["nfs"])
        return {"storageType": "nfs", "server": nfs.get("server"), "path": nfs.get("path")}
    vault, azure = _ci(cfg.get("keyvault")), _ci(cfg.get("azurestorage"))
    return {"storageType": "azureStorage", "azureAccount": azure.get("accountname"),
            "azureShare": azure.get("azureshare"), "keyVaultName": vault.get("vaultname"),
            "keyVaultKey": vault.get("name")}


def _role(raw: Any, name_key: str = "replicas") -> dict[str, Any]:
    r = _ci(raw)
    out: dict[str, Any] = {}
    for old, new in (("replicas", "replicas"), ("command", "command"), ("gpunum", "gpuNumber"),
                     ("cpunum", "cpuNumber"), ("memorymb", "memorySize"), ("image", "dockerImage"),
                     ("name", "name"), ("tasknum", "taskNumber"),
                     ("privateregistryauthpath", "privateRegistryAuthPath")):
        _put(out, new, r.get(old))
    policy = _ci(r.get("frameworkattemptcompletionpolicy"))
    if policy:
        out["frameworkAttemptCompletionPolicy"] = {"minFailedTaskCount": policy.get("minfailedtaskcount"),
                                                   "minSucceedTaskCount": policy.get("minsucceededtaskcount",
                                                                                     policy.get("minsucceedtaskcount"))}
    return out


def convert_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A v2 config dict equivalent to a v1 one."""
    v1 = _ci(data)
    trial = _ci(v1.get("trial"))
    out: dict[str, Any] = {}
    for old, new in (("experimentname", "experimentName"), ("trialconcurrency", "trialConcurrency"),
                     ("maxexecduration", "maxExperimentDuration"), ("maxtrialnum", "maxTrialNumber"),
                     ("maxtrialduration", "maxTrialDuration"), ("searchspacepath", "searchSpaceFile"),
                     ("searchspace", "searchSpace"), ("nnimanagerip", "nniManagerIp"), ("debug", "debug"),
                     ("loglevel", "logLevel"), ("logdir", "experimentWorkingDirectory"),
                     ("useannotation", "useAnnotation")):
        _put(out, new, v1.get(old))
    for kind in ("tuner", "assessor", "advisor"):
        _put(out, kind, _algorithm(v1.get(kind)))
    _put(out, "trialCommand", trial.get("command"))
    _put(out, "trialCodeDirectory", trial.get("codedir"))
    _put(out, "trialGpuNumber", trial.get("gpunum"))

    platform = str(v1.get("trainingserviceplatform", "local")).lower()
    if platform == "hybrid":  # NNI 2's hybridConfig: its platforms as v2's list, each from its own section
        listed = _ci(v1.get("hybridconfig")).get("trainingserviceplatforms") or []
        names = [listed] if isinstance(listed, str) else list(listed)  # one name written without a list
        out["trainingService"] = [_service(str(name).lower(), v1, trial) for name in names]
    else:
        out["trainingService"] = _service(platform, v1, trial)
    _warn_dropped(v1, platform)
    return out


def _service(platform: str, v1: dict[str, Any], trial: dict[str, Any]) -> dict[str, Any]:
    """The v2 section of one ``platform`` from a v1 config's sections (``v1``, ``trial``: canonical keys)."""
    ts: dict[str, Any] = {"platform": "openpai" if platform == "pai" else platform}
    if platform == "local":
        local = _ci(v1.get("localconfig"))
        _put(ts, "gpuIndices", local.get("gpuindices"))
        _put(ts, "maxTrialNumberPerGpu", local.get("maxtrialnumpergpu"))
        _put(ts, "useActiveGpu", local.get("useactivegpu"))
    elif platform == "remote":
        ts["machineList"] = [_machine(m) for m in v1.get("machinelist") or []]
        _put(ts, "reuseMode", _ci(v1.get("remoteconfig")).get("reuse"))
    elif platform == "pai":
        pai = _ci(v1.get("paiconfig"))
        for old, new in (("username", "username"), ("token", "token"), ("host", "host"), ("reuse", "reuseMode")):
            _put(ts, new, pai.get(old))
        for old, new in (("cpunum", "trialCpuNumber"), ("memorymb", "trialMemorySize"), ("image", "dockerImage"),
                         ("virtualcluster", "virtualCluster"), ("nnimanagernfsmountpath", "localStorageMountPoint"),
                         ("containernfsmountpath", "containerStorageMountPoint"),
                         ("paistorageconfigname", "storageConfigName")):
            _put(ts, new, trial.get(old))
    elif platform in ("kubeflow", "frameworkcontroller"):
        cfg = _ci(v1.get(f"{platform}config"))
        ts["storage"] = _k8s_storage(cfg)
        ts["reuseMode"] = bool(cfg.get("reuse", False))  # NNI's legacy launcher ran v1 configs without reuse
        _put(ts, "namespace", cfg.get("namespace"))
        if platform == "kubeflow":
            _put(ts, "operator", cfg.get("operator"))
            _put(ts, "apiVersion", cfg.get("apiversion"))
            for role in ("worker", "ps", "master"):
                if role in trial:
                    ts[role] = _role(trial[role])
        else:
            _put(ts, "serviceAccountName", cfg.get("serviceaccountname"))
            if trial.get("taskroles"):
                ts["taskRoles"] = [_role(r) for r in trial["taskroles"]]
            if cfg.get("configpath"):  # a custom Framework template; NNI ran it without reuse
                ts["configPath"] = cfg["configpath"]
    elif platform == "aml":
        aml = _ci(v1.get("amlconfig"))
        for old, new in (("subscriptionid", "subscriptionId"), ("resourcegroup", "resourceGroup"),
                         ("workspacename", "workspaceName"), ("computetarget", "computeTarget"),
                         ("maxtrialnumpergpu", "maxTrialNumberPerGpu")):
            _put(ts, new, aml.get(old))
        _put(ts, "dockerImage", trial.get("image"))
    elif platform == "adl":
        for old, new in (("image", "image"), ("namespace", "namespace"), ("imagepullsecrets", "imagePullSecrets"),
                         ("nfs", "nfs"), ("adaptive", "adaptive"), ("checkpoint", "checkpoint"),
                         ("cpunum", "cpuNumber"), ("memorysize", "memorySize")):
            _put(ts, new, trial.get(old))
        _put(ts, "logCollection", v1.get("logcollection"))
    elif platform == "dlts":
        dlts = _ci(v1.get("dltsconfig"))
        for key in ("dashboard", "cluster", "team", "email", "password"):
            _put(ts, key, dlts.get(key))
        _put(ts, "image", trial.get("image"))
    return ts


# v1 fields NNI acted on that have no v2 counterpart here, and what happens instead
_DROPPED = {  # canonical key -> why; the message uses NNI's spelling
    "multithread": "tuner calls are serialised in the controller; multiThread has no effect",
    "multiphase": "multi-phase trials are not supported: each trial gets one set of parameters",
    "versioncheck": "the trial runtime's version is always checked against the controller's",
    "logcollection": "trial logs stay in the trial directories (`trialflow log trial`); logCollection has no effect",
}


_NNI_NAMES = {"multithread": "multiThread", "multiphase": "multiPhase", "versioncheck": "versionCheck",
              "logcollection": "logCollection", "gpuindices": "gpuIndices", "gpunum": "gpuNum",
              "includeintermediateresults": "includeIntermediateResults"}


# the values of those fields that ask for nothing NNI would have done differently: no warning
_HARMLESS: dict[str, tuple[Any, ...]] = {"multithread": (False, None), "multiphase": (False, None),
                                         "versioncheck": (True, None), "logcollection": ("none", None),
                                         "gpuindices": (None, "", []), "gpunum": (0, None),
                                         "includeintermediateresults": (False, None)}


def _warn_dropped(v1: dict[str, Any], platform: str) -> None:
    for key, why in _DROPPED.items():
        if key in v1 and v1[key] not in _HARMLESS[key] and not (key == "logcollection" and platform == "adl"):
            warnings.warn(f"{_NNI_NAMES[key]}: {why} (a v1 field)", ConfigWarning, stacklevel=4)
    for kind in ("tuner", "assessor", "advisor"):
        section = _ci(v1.get(kind))
        for key in ("gpuindices", "gpunum", "includeintermediateresults"):
            if key in section and section[key] not in _HARMLESS[key]:
                warnings.warn(f"{kind}.{_NNI_NAMES[key]}: has no effect here (the {kind} runs in the controller "
                              "process and sees final results only) (a v1 field)", ConfigWarning, stacklevel=4)
