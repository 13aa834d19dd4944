"""Validation of custom objects the way a Kubernetes API server and the operators' webhooks do it.

The schemas are the published ones: the Kubeflow training-operator v1.9.0 CRDs and the AdaptDL CRD,
read from ``../shared/platform-specs/`` when that folder is beside the repository (or from
``$TRIALFLOW_PLATFORM_SPECS``), else from the unchanged copies in ``specs/`` next to this module.
FrameworkController publishes no CRD file (its schema is built in Go code); its schema is written
here from the controller's types as the platform reference describes them, and checked against the
upstream example Frameworks in ``specs/frameworkcontroller/``. Each file is parsed once per process.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml
from jsonschema import Draft7Validator

from .platform_specs import nullable as _nullable
from .platform_specs import specs_dir

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_FC_NAME = {"type": "string", "pattern": "^[a-z0-9]{1,63}$"}


FRAMEWORK_SCHEMA: dict[str, Any] = _nullable({
    "type": "object", "required": ["spec"],
    "properties": {
        "metadata": {"type": "object", "properties": {"name": _FC_NAME}},
        "spec": {
            "type": "object", "required": ["executionType", "taskRoles"],
            "properties": {
                "description": {"type": "string", "nullable": True},
                "executionType": {"type": "string", "enum": ["Create", "Start", "Stop"]},
                "retryPolicy": {"$ref": "#/definitions/retryPolicy"},
                "taskRoles": {"type": "array", "items": {
                    "type": "object", "required": ["name", "taskNumber", "task"],
                    "properties": {
                        "name": _FC_NAME,
                        "taskNumber": {"type": "integer", "minimum": 0, "maximum": 10000},
                        "frameworkAttemptCompletionPolicy": {
                            "type": "object", "required": ["minFailedTaskCount", "minSucceededTaskCount"],
                            "properties": {"minFailedTaskCount": {"type": "integer", "minimum": -1},
                                           "minSucceededTaskCount": {"type": "integer", "minimum": -1}}},
                        "task": {"type": "object", "required": ["pod"], "properties": {
                            "retryPolicy": {"$ref": "#/definitions/retryPolicy"},
                            "podGracefulDeletionTimeoutSec": {"type": "integer", "nullable": True},
                            "pod": {"type": "object"}}},
                    }}},
            }},
        "status": {"type": "object", "nullable": True},
    },
    "definitions": {"retryPolicy": {"type": "object", "properties": {
        "fancyRetryPolicy": {"type": "boolean"}, "maxRetryCount": {"type": "integer", "minimum": -2}}}},
})


@functools.cache
def crd_schema(plural: str) -> dict[str, Any]:
    """The openAPIV3Schema of a custom resource (``tfjobs``, ``pytorchjobs``, ``adaptdljobs``,
    ``frameworks``)."""
    files = {"tfjobs": "kubeflow.org_tfjobs.yaml", "pytorchjobs": "kubeflow.org_pytorchjobs.yaml",
             "adaptdljobs": "adaptdl-crd.yaml"}
    if plural == "frameworks":
        return FRAMEWORK_SCHEMA
    path = specs_dir() / "crds" / files[plural]
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        crd = yaml.load(f, Loader=loader)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@functools.cache
def _validator(plural: str) -> Draft7Validator:
    return Draft7Validator(crd_schema(plural))


def _path(error: Any) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<root>"


def validate_custom_object(plural: str, obj: dict[str, Any]) -> list[str]:
    """Every reason the API server (schema) or the operator's webhook would refuse ``obj``."""
    problems = [f"{_path(e)}: {e.message}" for e in sorted(_validator(plural).iter_errors(obj), key=str)]
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not name:
        problems.append("metadata.name: Required value")
    elif plural == "frameworks":
        pass  # the schema's pattern covers it
    elif len(name) > 63 or not _DNS1123_SUBDOMAIN.match(name):
        problems.append(f"metadata.name: Invalid value: {name!r}: must be a lowercase RFC 1123 name of at most "
                        "63 characters")
    if not problems:
        problems += _WEBHOOKS.get(plural, lambda _o: [])(obj)
    return problems


def _containers(template: Any, where: str) -> list[str]:
    spec = (template or {}).get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return [f"{where}.template.spec.containers: Required value"]
    return [f"{where}.template.spec.containers[{i}].image: Required value"
            for i, c in enumerate(containers) if not c.get("image")]


def _kubeflow_webhook(kind: str, key: str, types: tuple[str, ...], container: str, single: tuple[str, ...]
                      ) -> Any:
    def check(obj: dict[str, Any]) -> list[str]:
        problems = []
        specs = obj["spec"][key]
        if not specs:
            problems.append(f"spec.{key}: must have at least one replica spec")
        for rtype, rspec in specs.items():
            where = f"spec.{key}[{rtype}]"
            canonical = next((t for t in types if t.lower() == rtype.lower()), None)
            if canonical is None:
                problems.append(f"{where}: Unsupported value: {rtype!r}: supported values: {', '.join(types)}")
                continue
            problems += _containers(rspec.get("template"), where)
            names = [c.get("name") for c in ((rspec.get("template") or {}).get("spec") or {}).get("containers", [])]
            if container not in names:
                problems.append(f"{where}.template.spec.containers: {kind} needs a container named {container!r}")
            if canonical in single and rspec.get("replicas", 1) != 1:
                problems.append(f"{where}.replicas: Invalid value: {rspec.get('replicas')}: must be 1")
        return problems

    return check


def _framework_webhook(obj: dict[str, Any]) -> list[str]:
    problems = []
    names = [r["name"] for r in obj["spec"]["taskRoles"]]
    if len(set(names)) != len(names):
        problems.append("spec.taskRoles: task role names must be unique")
    for i, role in enumerate(obj["spec"]["taskRoles"]):
        problems += _containers(role["task"]["pod"], f"spec.taskRoles[{i}].task.pod")
    return problems


def _adaptdl_webhook(obj: dict[str, Any]) -> list[str]:
    problems = _containers({"spec": obj["spec"]["template"].get("spec")}, "spec")
    low, high = obj["spec"].get("minReplicas", 0), obj["spec"].get("maxReplicas")
    if high is not None and low > high:
        problems.append(f"spec.minReplicas: {low} is greater than maxReplicas {high}")
    return problems


_WEBHOOKS: dict[str, Any] = {
    "tfjobs": _kubeflow_webhook("TFJob", "tfReplicaSpecs", ("Chief", "PS", "Worker", "Evaluator", "Master"),
                                "tensorflow", ("Chief", "Master")),
    "pytorchjobs": _kubeflow_webhook("PyTorchJob", "pytorchReplicaSpecs", ("Master", "Worker"), "pytorch",
                                     ("Master",)),
    "frameworks": _framework_webhook,
    "adaptdljobs": _adaptdl_webhook,
}


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and (value == "" or bool(re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", value)))


__all__ = ["FRAMEWORK_SCHEMA", "crd_schema", "specs_dir", "valid_label_value", "validate_custom_object",
           "_DNS1123_LABEL"]
