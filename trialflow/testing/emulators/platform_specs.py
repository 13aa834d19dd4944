"""The published platform specs the emulators (and tests) validate against, and the OpenPAI and
DLTS validators built on them.

Files are read from ``../shared/platform-specs/`` when that folder is beside the repository (or from
``$TRIALFLOW_PLATFORM_SPECS``), else from the unchanged copies in ``specs/`` next to this module;
each is parsed once per process.

- OpenPAI: a job protocol is checked against ``openpai-protocol-v2-schema.yaml``'s ``JobProtocol``
  (Draft 7) plus the REST server's own checks that the schema only describes in words: no unknown
  top-level field, at least one task role, role names that are C identifiers, and a ``dockerImage``
  naming a dockerimage prerequisite. Responses are checked against ``swagger.yaml``'s schemas (its
  remote ``JobProtocol`` reference resolved to the local copy).
- DLTS: request bodies against the dashboard's validators (``job``, ``status``, ``endpoints``,
  ``batch-status`` ``.schema.json``).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator

PACKAGED_SPECS = Path(__file__).parent / "specs"
_C_IDENTIFIER = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def specs_dir() -> Path:
    """The platform-specs folder in use (see the module docstring for the order)."""
    override = os.environ.get("TRIALFLOW_PLATFORM_SPECS")
    if override:
        return Path(override)
    beside = Path(__file__).resolve().parents[3].parent / "shared" / "platform-specs"
    return beside if (beside / "crds").is_dir() else PACKAGED_SPECS


def nullable(schema: Any) -> Any:
    """OpenAPI's ``nullable: true`` as JSON Schema (``type: [X, "null"]``)."""
    if isinstance(schema, list):
        return [nullable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: nullable(v) for k, v in schema.items() if k != "nullable"}
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def _yaml(relative: str) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(specs_dir() / relative, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def _messages(validator: Draft7Validator, instance: Any) -> list[str]:
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(instance), key=str)]


@functools.cache
def _protocol_validator() -> Draft7Validator:
    document = _yaml("openpai/openpai-protocol-v2-schema.yaml")
    return Draft7Validator({"$ref": "#/components/schemas/JobProtocol", "components": document["components"]})


@functools.cache
def _protocol_fields() -> frozenset[str]:
    schemas = _yaml("openpai/openpai-protocol-v2-schema.yaml")["components"]["schemas"]
    fields = set(schemas["PrerequisiteInfo"]["properties"])
    for part in schemas["JobProtocol"]["allOf"]:
        fields.update(part.get("properties") or {})
    return frozenset(fields)


def openpai_protocol_errors(protocol: Any) -> list[str]:
    """Every reason OpenPAI's REST server would refuse ``protocol`` with 400 InvalidProtocolError."""
    if not isinstance(protocol, dict):
        return ["<root>: the job protocol must be a YAML mapping"]
    problems = _messages(_protocol_validator(), protocol)
    problems += [f"{key}: unknown field of the job protocol" for key in sorted(set(protocol) - _protocol_fields())]
    roles = protocol.get("taskRoles")
    if isinstance(roles, dict):
        if not roles:
            problems.append("taskRoles: at least one task role is required")
        images = {p.get("name") for p in protocol.get("prerequisites") or []
                  if isinstance(p, dict) and p.get("type") == "dockerimage"}
        for name, role in roles.items():
            if not _C_IDENTIFIER.match(str(name)):
                problems.append(f"taskRoles.{name}: a task role name must be a valid C identifier")
            if isinstance(role, dict) and role.get("dockerImage") not in images:
                problems.append(f"taskRoles.{name}.dockerImage: {role.get('dockerImage')!r} names no dockerimage "
                                "prerequisite")
    return problems


@functools.cache
def _swagger_validator(schema: str) -> Draft7Validator:
    components = dict(_yaml("openpai/swagger.yaml")["components"])
    schemas = dict(components["schemas"])
    schemas["JobProtocol"] = {"$ref": "#/protocol/JobProtocol"}
    protocol = _yaml("openpai/openpai-protocol-v2-schema.yaml")["components"]["schemas"]
    rewritten = json.loads(json.dumps(protocol).replace("#/components/schemas/", "#/protocol/"))
    return Draft7Validator(nullable({"$ref": f"#/components/schemas/{schema}",
                                     "components": {**components, "schemas": schemas}, "protocol": rewritten}))


def openpai_response_errors(schema: str, payload: Any) -> list[str]:
    """Where ``payload`` departs from the swagger's ``components.schemas.<schema>``."""
    return _messages(_swagger_validator(schema), payload)


@functools.cache
def _dlts_validator(name: str) -> Draft7Validator:
    with open(specs_dir() / "dlts" / f"{name}.schema.json", encoding="utf-8") as f:
        return Draft7Validator(json.load(f))


def dlts_body_errors(name: str, body: Any) -> list[str]:
    """Where ``body`` fails the DLTS dashboard's ``<name>.schema.json`` validator."""
    return _messages(_dlts_validator(name), body)
