"""The metric record format shared by trials (writers) and services (readers). Standard library only.

A record is NNI's metric JSON plus a format version::

    {"parameter_id": 7, "trial_job_id": "abcde", "type": "FINAL", "sequence": 0,
     "value": "<JSON text of the user's value>", "version": 1}

Framings (docs/nni.md#metric-records), kept byte-compatible with NNI so NNI's own SDK also works:

* file:   ``b"ME" + b"%06d" % len(payload) + payload``, payload = JSON + ``"\\n"`` (UTF-8);
* stdout: one line ``NNISDK_MEb'<JSON>'``.

Readers are incremental (a byte cursor), skip garbage up to the next frame, and reject records over
``MAX_RECORD_BYTES`` or with a bad shape, reporting why instead of failing the trial.
"""

from __future__ import annotations

import json
import math
import re

TYPE_CHECKING = False  # typing stays unimported at run time: its import would cost every trial process
if TYPE_CHECKING:
    from typing import Any

FORMAT_VERSION = 1
MAX_RECORD_BYTES = 1_000_000
MAX_SEQUENCE = 2**31 - 1  # what every store's sequence column holds
MAX_DEPTH = 32
METRIC_TYPES = ("PERIODICAL", "FINAL")
STDOUT_TAG = b"NNISDK_MEb'"  # what marks a metric line on stdout
STDOUT_MARKER = re.compile(re.escape(STDOUT_TAG) + rb"(.*?)'\s*$")
_FRAME_HEAD = 8  # "ME" + 6 digits


class MetricRecordError(ValueError):
    """A metric line or record that cannot be used; the message says what is wrong."""


class MetricRecord:
    """One metric report (immutable). A plain class, not a dataclass: every trial imports this
    module, and ``dataclasses`` (with ``inspect``) would add their import to each trial's start-up."""

    __slots__ = ("trial_id", "type", "sequence", "value", "parameter_id")
    trial_id: str
    type: str
    sequence: int
    value: Any
    parameter_id: int | None

    def __init__(self, trial_id: str, type: str, sequence: int, value: Any,  # noqa: A002 -- NNI's field name
                 parameter_id: int | None = None) -> None:
        for name, field in zip(self.__slots__, (trial_id, type, sequence, value, parameter_id), strict=True):
            object.__setattr__(self, name, field)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"MetricRecord is immutable; cannot set {name}")

    def _key(self) -> tuple[Any, ...]:
        return (self.trial_id, self.type, self.sequence, self.value, self.parameter_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetricRecord) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.trial_id, self.type, self.sequence, self.parameter_id))

    def __repr__(self) -> str:
        return "MetricRecord({})".format(", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__))

    def to_json(self) -> str:
        return json.dumps({"parameter_id": self.parameter_id, "trial_job_id": self.trial_id, "type": self.type,
                           "sequence": self.sequence, "value": json.dumps(self.value), "version": FORMAT_VERSION})


def encode_file_record(record: MetricRecord) -> bytes:
    payload = (record.to_json() + "\n").encode("utf-8")
    if len(payload) >= MAX_RECORD_BYTES:
        raise MetricRecordError(f"metric record is {len(payload)} bytes; the limit is {MAX_RECORD_BYTES}")
    return b"ME" + b"%06d" % len(payload) + payload


def is_metric_line(line: bytes) -> bool:
    """Whether an output line is a metric record (NNI's stdout framing): protocol, not output to show."""
    return STDOUT_TAG in line


def encode_stdout_line(record: MetricRecord) -> str:
    return f"NNISDK_MEb'{record.to_json()}'"


def parse_record(text: str | bytes, expected_trial: str | None = None) -> MetricRecord:
    """Validate one record's JSON; values are decoded (they are JSON text inside the record)."""
    if len(text) > MAX_RECORD_BYTES:
        raise MetricRecordError(f"metric record is {len(text)} bytes; the limit is {MAX_RECORD_BYTES}")
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MetricRecordError(f"metric record is not valid JSON: {exc}") from None
    except RecursionError:
        raise MetricRecordError(f"metric record is nested more than {MAX_DEPTH} levels deep") from None
    if not isinstance(data, dict):
        raise MetricRecordError(f"metric record must be a JSON object, got {type(data).__name__}")
    kind, seq, trial = data.get("type"), data.get("sequence", 0), data.get("trial_job_id")
    if kind == "REQUEST_PARAMETER":
        raise MetricRecordError("REQUEST_PARAMETER records are not metrics")
    if kind not in METRIC_TYPES:
        raise MetricRecordError(f"metric type must be PERIODICAL or FINAL, got {kind!r}")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQUENCE:
        raise MetricRecordError(f"metric sequence must be a non-negative integer up to {MAX_SEQUENCE}, "
                                f"got {_short(seq)}")
    if not isinstance(trial, str) or (expected_trial is not None and trial != expected_trial):
        raise MetricRecordError(f"metric belongs to trial {trial!r}, not {expected_trial!r}")
    raw = data.get("value")
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = raw  # a plain string value is kept as it is; the tuner decides whether it is usable
    except RecursionError:
        raise MetricRecordError(f"metric value is nested more than {MAX_DEPTH} levels deep") from None
    pid = data.get("parameter_id")
    return MetricRecord(trial, kind, seq, _check_value(value), pid if isinstance(pid, int) else None)


def _short(value: Any) -> str:
    if isinstance(value, int) and abs(value) >= 10**30:  # repr() of a huge int is slow, or refused
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_value(value: Any, depth: int = 0) -> Any:
    """The value as stored, or :class:`MetricRecordError` for one no reader could use: nested deeper than
    ``MAX_DEPTH``, or an integer beyond any float (``10**400``: every consumer converts to float)."""
    if depth > MAX_DEPTH:
        raise MetricRecordError(f"metric value is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, float) and not math.isfinite(value):
        return value  # kept (stored as text); the tuner marks the result invalid
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise MetricRecordError(f"metric value {_short(value)} is out of range (a float holds up to "
                                    "1.8e308)") from None
    if isinstance(value, dict):
        return {k: _check_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_check_value(v, depth + 1) for v in value]
    return value


class ParseResult:
    """Records and errors of one read; ``offset``: bytes consumed, resume reading there."""

    __slots__ = ("records", "errors", "offset")

    def __init__(self, records: list[MetricRecord], errors: list[str], offset: int) -> None:
        self.records, self.errors, self.offset = records, errors, offset


def parse_file_frames(data: bytes, offset: int = 0, expected_trial: str | None = None) -> ParseResult:
    """Parse complete ``ME`` frames from ``data`` (the file's bytes from ``offset``). A partial frame at
    the end is left for the next read; garbage is skipped up to the next ``ME`` marker."""
    records: list[MetricRecord] = []
    errors: list[str] = []
    pos = 0
    while pos < len(data):
        if data[pos:pos + 2] != b"ME" or len(data) - pos >= _FRAME_HEAD and not data[pos + 2:pos + 8].isdigit():
            if len(data) - pos < _FRAME_HEAD and data[pos:pos + 2] in (b"M", b"ME", b""):
                break  # maybe the start of a frame still being written
            nxt = data.find(b"ME", pos + 1)
            errors.append(f"skipped {((nxt if nxt >= 0 else len(data)) - pos)} bytes of garbage in the metrics file")
            if nxt < 0:
                pos = len(data)
                break
            pos = nxt
            continue
        if len(data) - pos < _FRAME_HEAD:
            break
        length = int(data[pos + 2:pos + 8])
        if pos + _FRAME_HEAD + length > len(data):
            break
        payload = data[pos + _FRAME_HEAD:pos + _FRAME_HEAD + length]
        pos += _FRAME_HEAD + length
        try:
            records.append(parse_record(payload, expected_trial))
        except MetricRecordError as exc:
            errors.append(str(exc))
    return ParseResult(records, errors, offset + pos)


def parse_stdout_lines(data: bytes, offset: int = 0, expected_trial: str | None = None,
                       max_line: int = MAX_RECORD_BYTES + 32) -> ParseResult:
    """Metric marker lines among ordinary output; an unterminated last line waits for more data
    unless it is already longer than ``max_line`` (then it is skipped as oversized)."""
    records: list[MetricRecord] = []
    errors: list[str] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            if len(data) - pos > max_line:
                errors.append(f"skipped an output line over {max_line} bytes")
                pos = len(data)
            break
        line = data[pos:end]
        pos = end + 1
        if not is_metric_line(line):
            continue
        match = STDOUT_MARKER.search(line.rstrip(b"\r"))
        if match is None:
            errors.append("malformed metric line (expected NNISDK_MEb'<json>')")
            continue
        try:
            records.append(parse_record(match.group(1), expected_trial))
        except MetricRecordError as exc:
            errors.append(str(exc))
    return ParseResult(records, errors, offset + pos)
