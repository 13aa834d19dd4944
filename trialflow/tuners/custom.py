"""Customized tuners and assessors: classes of the user's own, NNI's way.

A config names one by ``className: module.Class`` (+ ``codeDirectory``, put on ``sys.path``), or by
the ``builtinName`` it was registered under with ``trialflow algo register --meta meta.yml`` (see
:mod:`trialflow.tuners.registry`). ``classArgs`` are the constructor's keyword arguments; a registered
algorithm's ``classArgsValidator`` checks them first. A class written against NNI's API
(``nni.tuner.Tuner`` / ``nni.assessor.Assessor``) runs through :class:`NniTuner` /
:class:`trialflow.assessors.NniAssessor`; the bundled ``nni`` package supplies those base classes
when NNI itself is not installed.

Such a class gets what NNI's dispatcher gets (:func:`dispatcher_environment`): ``NNI_CHECKPOINT_DIRECTORY``,
the experiment's ``checkpoint/`` folder, and ``NNI_MODE``; on a resume its ``load_checkpoint()`` is called
once, before anything else.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..trial import NNI_SHIM_DIR
from .base import Suggestion, Tuner, TunerError, check_args
from .registry import registered

log = logging.getLogger("trialflow.tuner")
CHECKPOINT_FOLDER = "checkpoint"  # NNI's: <experiment>/checkpoint, the dispatcher's NNI_CHECKPOINT_DIRECTORY
# the instance attribute the bundled nni.recoverable.Recoverable.get_checkpoint_path reads first
CHECKPOINT_ATTRIBUTE = "_trialflow_checkpoint_directory"


@dataclass(frozen=True)
class Checkpoint:
    """A customized algorithm's checkpoint folder (NNI's ``<experiment>/checkpoint``, kept across runs)
    and whether this run resumes the experiment (an earlier run made the folder)."""

    folder: Path
    resumed: bool

    @property
    def environment(self) -> dict[str, str]:
        """NNI's dispatcher variables for it (the names trials never inherit:
        :data:`trialflow.platforms.inherited_env.DISPATCHER_ONLY`)."""
        return {"NNI_CHECKPOINT_DIRECTORY": str(self.folder), "NNI_MODE": "resume" if self.resumed else "start"}

    def attach(self, algorithm: Any) -> None:
        """``algorithm.get_checkpoint_path()`` answers this folder from now on, whatever
        ``NNI_CHECKPOINT_DIRECTORY`` says (another experiment running in this process sets it too). An
        object that takes no attribute (``__slots__``) is left to the variable."""
        try:
            setattr(algorithm, CHECKPOINT_ATTRIBUTE, str(self.folder))
        except (AttributeError, TypeError):
            pass


_active: list[Checkpoint] = []  # this process's experiments with a customized algorithm, oldest first
_before: dict[str, str | None] = {}  # the variables as they were before the first of them
_active_lock = threading.Lock()


@contextmanager
def dispatcher_environment(experiment_dir: Path) -> Iterator[Checkpoint]:
    """The checkpoint of the experiment in ``experiment_dir`` (its :data:`CHECKPOINT_FOLDER`, made 0700
    when missing), with NNI's dispatcher variables set in this process for the block, as NNI sets them
    for the process that runs a customized algorithm: ``NNI_CHECKPOINT_DIRECTORY`` and ``NNI_MODE``. With
    several such experiments in one process the variables name the latest started that still runs (each
    algorithm attached with :meth:`Checkpoint.attach` finds its own folder all the same); after the last
    block they are as before the first. Trials never inherit them
    (:data:`trialflow.platforms.inherited_env.DISPATCHER_ONLY`). Raises :class:`TunerError` when the
    folder cannot be made (a file of its name is left as it is)."""
    folder = experiment_dir / CHECKPOINT_FOLDER
    resumed = folder.is_dir()
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise TunerError(f"the customized algorithm's checkpoint folder {folder} cannot be made ({exc.strerror}): "
                         "move what is there away, then run again") from None
    checkpoint = Checkpoint(folder, resumed)
    with _active_lock:
        if not _active:
            _before.update((name, os.environ.get(name)) for name in checkpoint.environment)
        _active.append(checkpoint)
        _export(checkpoint)
    try:
        yield checkpoint
    finally:
        with _active_lock:
            _active.remove(checkpoint)
            _export(_active[-1] if _active else None)


def _export(checkpoint: Checkpoint | None) -> None:
    """Set the dispatcher variables to ``checkpoint``'s, or back to :data:`_before` (called under the lock)."""
    values: Mapping[str, str | None] = checkpoint.environment if checkpoint is not None else _before
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@dataclass(frozen=True)
class CustomAlgorithm:
    """A loaded customized algorithm: its class and checked constructor arguments."""

    label: str  # how the config named it, for messages
    cls: type
    class_args: dict[str, Any]

    def instantiate(self) -> Any:
        try:
            return self.cls(**self.class_args)
        except Exception as exc:
            raise TunerError(f"{self.label}: creating {self.cls.__name__}(**classArgs) failed: "
                             f"{type(exc).__name__}: {exc}") from exc


def is_custom(spec: Any, builtin: dict[str, Any]) -> bool:
    """Whether a tuner/assessor config names a customized class (``className`` or a registered name)."""
    return bool(spec.class_name) or (spec.name is not None and spec.name.lower() not in builtin
                                     and registered(spec.name) is not None)


def check_algorithm(spec: Any, kind: str, native: type, builtin: dict[str, Any], known: str) -> str | None:
    """NNI's check of a tuner or assessor at ``nnictl create``: a customized one's class is loaded and
    checked (see :func:`load_custom`) and its ``classArgsValidator`` run (returns None); a built-in's
    name and ``classArgs`` are checked against ``builtin`` ({name: (factory, allowed args)}; returns
    its lowercase name). Nothing is built. Raises :class:`TunerError`."""
    if is_custom(spec, builtin):
        load_custom(spec, kind, native)
        return None
    name = (spec.name or "").lower()
    if name not in builtin:
        raise TunerError(f"unknown {kind} {spec.name!r}; built-in: {known}")
    check_args(f"{kind} {spec.name}", spec.class_args, builtin[name][1])
    return name


def load_custom(spec: Any, kind: str, native: type) -> CustomAlgorithm:
    """The class a ``className`` or registered ``name`` stands for, its ``classArgs`` validated. Unless
    it subclasses ``native`` (trialflow's own base for ``kind``, whose abstract methods Python checks),
    it is held to NNI's contract (:data:`NNI_CONTRACT`). Raises :class:`TunerError`."""
    class_name, code_dir, validator = spec.class_name, spec.code_directory, None
    label = f"{kind} {class_name}"
    if not class_name:
        entry = registered(spec.name)
        if entry is None:
            raise TunerError(f"unknown {kind} {spec.name!r}")
        if entry.algo_type != kind:
            raise TunerError(f"{spec.name!r} is registered as a {entry.algo_type}, not a {kind}")
        class_name, code_dir, validator = entry.class_name, entry.code_directory, entry.class_args_validator
        label = f"{kind} {entry.builtin_name}"
    cls = load_class(class_name, code_dir, label)
    if not issubclass(cls, native):
        _check_nni_contract(cls, kind, label)
    if validator:
        _validate(load_class(validator, code_dir, f"{label} classArgsValidator"), spec.class_args, label)
    return CustomAlgorithm(label, cls, dict(spec.class_args))


# What a class written against NNI's API must implement itself, by kind (each entry lists
# alternatives; NNI calls all of them in every experiment): the bundled base class (module
# ``nni.tuner`` or ``nni.assessor``) leaves them out, and NNI's own defines placeholders that fail at
# their first call, mid-experiment.
NNI_CONTRACT = {
    "tuner": ("nni.tuner", "Tuner", (("generate_parameters", "generate_multiple_parameters"),
                                     ("receive_trial_result",), ("update_search_space",))),
    "assessor": ("nni.assessor", "Assessor", (("assess_trial",),)),
}


def _check_nni_contract(cls: type, kind: str, label: str) -> None:
    """Raise :class:`TunerError` naming the methods of NNI's contract that ``cls`` lacks or leaves to
    NNI's base class -- at load time (``trialflow create``), not at the experiment's first call."""
    module, base, required = NNI_CONTRACT[kind]

    def implemented(name: str) -> bool:
        method = getattr(cls, name, None)
        return callable(method) and getattr(method, "__module__", None) != module

    missing = [" or ".join(names) for names in required if not any(implemented(n) for n in names)]
    if missing:
        raise TunerError(f"{label}: {cls.__name__} does not implement {', '.join(missing)}; a customized {kind} "
                         f"subclasses {module}.{base} and implements {'them' if len(missing) > 1 else 'it'}")


def load_class(dotted: str, code_directory: Any, label: str) -> type:
    """``module.Class`` importable from ``code_directory`` (first on sys.path), else the environment."""
    module_name, _, cls_name = dotted.rpartition(".")
    if not module_name:
        raise TunerError(f"{label}: className {dotted!r} must be 'module.ClassName' (e.g. my_tuner.MyTuner)")
    if NNI_SHIM_DIR not in sys.path:
        sys.path.append(NNI_SHIM_DIR)  # `from nni.tuner import Tuner` without NNI installed
    if code_directory is not None:
        folder = str(Path(code_directory).resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        where = f" in codeDirectory {code_directory}" if code_directory is not None else ""
        raise TunerError(f"{label}: cannot load {dotted!r}{where}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing
        raise TunerError(f"{label}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(cls, type):
        raise TunerError(f"{label}: {dotted!r} is not a class")
    return cls


def _validate(validator_cls: type, class_args: dict[str, Any], label: str) -> None:
    try:
        validator_cls().validate_class_args(**class_args)
    except Exception as exc:  # noqa: BLE001 -- any error of the validator is a classArgs problem
        raise TunerError(f"{label}: classArgs rejected by {validator_cls.__name__}: {exc}") from None


def describe_failure(owner: Any, method: str, exc: BaseException) -> str:
    """Log a customized algorithm's exception with its traceback (to the Prefect run's log when in
    one); the one-line reason to report."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    name = type(owner).__name__
    try:
        logger: Any = get_run_logger()
    except MissingContextError:
        logger = log
    logger.error("customized %s.%s raised:\n%s", name, method, "".join(traceback.format_exception(exc)))
    return f"customized {name}.{method} raised {type(exc).__name__}: {exc}"


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (numpy scalars and arrays become numbers and lists)."""
    def convert(obj: Any) -> Any:
        for attr in ("tolist", "item"):
            if hasattr(obj, attr):
                return getattr(obj, attr)()
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")

    return json.loads(json.dumps(value, default=convert))


class NniTuner(Tuner):
    """An NNI-API tuner (``generate_parameters`` / ``receive_trial_result`` ...) behind trialflow's
    tuner seam, bound to the experiment's ``checkpoint`` (its ``load_checkpoint()`` called first when the
    run resumes), then ``update_search_space``. Its raw values are the parameters it generated, so a
    resume replays them to it with ``import_data``. An exception of the user's tuner is kept in
    :attr:`failure` (with its traceback in the log) and ends the experiment as ERROR; it is never
    retried."""

    def __init__(self, tuner: Any, search_space: Any, label: str, checkpoint: Checkpoint | None = None) -> None:
        self.tuner = tuner
        self.label = label
        self.maximize = False
        self.failure = None
        self._next_id = 0
        self._params: dict[int, Any] = {}
        if checkpoint is not None:
            checkpoint.attach(tuner)
            if checkpoint.resumed:
                self._call("load_checkpoint")
        self._call("update_search_space", search_space)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.failure is not None:
            raise TunerError(self.failure)
        try:
            return getattr(self.tuner, method)(*args, **kwargs)
        except Exception as exc:
            if _is_no_more_trials(exc):
                raise
            self.failure = describe_failure(self.tuner, method, exc)
            raise TunerError(self.failure) from None

    def suggest(self) -> Suggestion | None:
        pid = self._new_id()
        try:
            batch = self._call("generate_multiple_parameters", [pid])
        except Exception as exc:
            if _is_no_more_trials(exc):
                return None
            raise
        if not batch:
            return None
        params = batch[0]
        if not isinstance(params, dict):
            self.failure = (f"{self.label}: generate_parameters must return a dict of parameters, "
                            f"got {type(params).__name__}")
            raise TunerError(self.failure)
        params = jsonable(params)
        self._params[pid] = params
        return Suggestion(pid, params, {"parameters": params})

    def observe(self, parameter_id: int, value: float | None) -> None:
        self.conclude(parameter_id, value, value, value is not None)

    def conclude(self, parameter_id: int, value: float | None, final: Any, succeeded: bool) -> None:
        """As NNI: ``receive_trial_result`` with the final result as reported (when there is one),
        then ``trial_end``."""
        params = self._params.get(parameter_id)
        if final is not None and params is not None:
            self._tolerant("receive_trial_result", parameter_id, params, final)
        self._tolerant("trial_end", parameter_id, succeeded)

    def _tolerant(self, method: str, *args: Any) -> None:
        """Call without raising: a failure is recorded and ends the experiment from its loop (these
        calls happen in a trial's task, whose end is already recorded)."""
        try:
            self._call(method, *args)
        except Exception:  # noqa: BLE001 -- kept in self.failure
            return

    def _replay(self, parameter_id: int, raw: dict[str, Any], value: float | None) -> None:
        params = raw.get("parameters", raw)
        self._params[parameter_id] = params
        if value is not None:
            self._tolerant("import_data", [{"parameter": params, "value": value}])


def _is_no_more_trials(exc: BaseException) -> bool:
    return type(exc).__name__ == "NoMoreTrialError"
