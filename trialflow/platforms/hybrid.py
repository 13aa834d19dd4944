"""Hybrid experiments: a ``trainingService`` list (NNI's hybrid mode) behind the one service interface.

Each section is a member service with its own overrides (``trialCommand``, ``trialGpuNumber``,
``trialCodeDirectory``, ``nniManagerIp``, ``reuseMode``, ...). Its name is its platform, with
``#2``, ``#3``... for the second and later sections of the same platform.

Placement (NNI picked at random among services with capacity): a new trial goes to the member with
the most *weighted free capacity*, ``weight x (maxConcurrency - running)``, among members with a free
slot that have not failed a submission in the last :data:`COOLDOWN_SECONDS`; ties go to the member
running fewer trials, then to the earlier section. ``maxConcurrency`` caps a member; without one, a
member's cap is the experiment's ``trialConcurrency`` in force, following ``trialflow update
concurrency`` (:meth:`HybridService.follow_concurrency`). ``weight`` (default 1) scales its share.
When every member has a ``maxConcurrency`` the experiment's window is at most their sum
(:meth:`HybridService.capacity`).

A trial's handle is its member's handle plus ``data["service"]`` (the member's name): polls, kills,
logs, resume and reuse go to that member. A retried submission stays on the member first chosen (so
a trial never runs on two). Lifecycle: :meth:`prepare` prepares every member with its platform's
retry policy; one that cannot start fails the experiment with an error naming it. A member that
becomes unreachable later only fails its own trials; the others keep taking new ones.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig, TrainingServiceConfig
from .base import (
    SERVICE_KEY,
    CodeRef,
    PlatformError,
    TrainingService,
    TransientPlatformError,
    TrialHandle,
    TrialSpec,
    TrialUpdate,
)
from .errors import RetryPolicy
from .report_desk import ReportDesk
from .table import create_service, platform

log = logging.getLogger("trialflow.hybrid")
COOLDOWN_SECONDS = 30.0


@dataclass
class Member:
    name: str
    index: int
    config: TrainingServiceConfig
    service: TrainingService
    capacity: int
    weight: float
    running: set[str] = field(default_factory=set)
    failed_at: float = -1e18  # monotonic time of its last failed submission
    code: CodeRef | None = None

    @property
    def label(self) -> str:
        return f"{self.name} (trainingService[{self.index}])"

    def free(self) -> int:
        return self.capacity - len(self.running)


def member_names(services: list[TrainingServiceConfig]) -> list[str]:
    """``local``, ``remote``, ``remote#2``...: each section's platform, numbered from its second use."""
    seen: dict[str, int] = {}
    names = []
    for cfg in services:
        seen[cfg.platform] = seen.get(cfg.platform, 0) + 1
        names.append(cfg.platform if seen[cfg.platform] == 1 else f"{cfg.platform}#{seen[cfg.platform]}")
    return names


class HybridService(TrainingService):
    platform = "hybrid"

    def __init__(self, config: ExperimentConfig, experiment_dir: Path) -> None:
        self.members: dict[str, Member] = {}
        self._lock = threading.Lock()
        self._placed: dict[str, str] = {}  # trial id -> member name, from its first submission attempt
        try:
            for i, (name, cfg) in enumerate(zip(member_names(config.services), config.services, strict=True)):
                capacity = cfg.max_concurrency or config.trial_concurrency
                self.members[name] = Member(name, i, cfg, create_service(cfg, experiment_dir), capacity, cfg.weight)
        except Exception:
            self.close()
            raise

    # ---- lifecycle ----------------------------------------------------------------------

    def prepare(self) -> None:
        for member in self.members.values():
            def note(exc: Exception, delay: float, label: str = member.label) -> None:
                log.warning("preparing %s failed (%s); retrying in %.0f s", label, exc, delay)

            try:
                platform(member.config.platform).retry.call(member.service.prepare, note)
            except PlatformError as exc:
                raise PlatformError(f"training service {member.label} cannot start: {exc}") from None

    def upload_code(self, code_dir: Path) -> CodeRef:
        """Each member gets its own ``trialCodeDirectory`` (``code_dir`` is the first section's)."""
        for member in self.members.values():
            if member.code is None:
                try:
                    member.code = member.service.upload_code(Path(member.config.trial_code_directory))
                except PlatformError as exc:
                    raise type(exc)(f"{member.label}: {exc}") from None
        return CodeRef(str(code_dir))

    def capacity(self) -> int | None:
        """The most trials the members can run together, when every one has a ``maxConcurrency``."""
        if all(m.config.max_concurrency for m in self.members.values()):
            return sum(m.capacity for m in self.members.values())
        return None

    def follow_concurrency(self, concurrency: int) -> None:
        """Members without a ``maxConcurrency`` take ``concurrency`` as their cap. A member running more
        than a lowered cap keeps its trials and takes no new one until it is under it."""
        with self._lock:
            for member in self.members.values():
                if not member.config.max_concurrency:
                    member.capacity = concurrency

    # ---- placement ------------------------------------------------------------------------

    def _choose(self) -> Member:
        now = time.monotonic()
        with_room = [m for m in self.members.values() if m.free() > 0]
        healthy = [m for m in with_room if now - m.failed_at > COOLDOWN_SECONDS] or with_room
        if not healthy:
            raise TransientPlatformError("every training service of the hybrid experiment is at its maxConcurrency")
        return max(healthy, key=lambda m: (m.weight * m.free(), -len(m.running), -m.index))

    def _place(self, trial_id: str) -> Member:
        """The member the trial runs on: the one its first attempt chose, else the best with room now
        (it holds a slot there until :meth:`abandon`)."""
        with self._lock:
            name = self._placed.get(trial_id)
            member = self.members[name] if name else self._choose()
            self._placed[trial_id] = member.name
            member.running.add(trial_id)
        return member

    def code_directory(self) -> Path:
        """The first section's; :meth:`upload_code` uploads each member's own."""
        return next(iter(self.members.values())).service.code_directory()

    def trial_spec(self, experiment_id: str, trial_id: str, sequence: int, parameter_id: int,
                   parameters: dict[str, Any]) -> TrialSpec:
        """Places the trial, and its spec is the chosen member's (that section's command, code and GPUs)."""
        return self._place(trial_id).service.trial_spec(experiment_id, trial_id, sequence, parameter_id, parameters)

    def concurrency_cap(self) -> tuple[str, int] | None:
        return None  # refused in a hybrid config: members cap their share with maxConcurrency

    def submit(self, spec: TrialSpec, code: CodeRef) -> TrialHandle:
        member = self._place(spec.trial_id)
        try:
            handle = member.service.submit(spec, member.code or code)
        except PlatformError as exc:
            with self._lock:
                member.failed_at = time.monotonic()
                if not isinstance(exc, TransientPlatformError):  # no retry will come: free its slot
                    member.running.discard(spec.trial_id)
            raise type(exc)(f"{member.label}: {exc}") from None
        return TrialHandle(handle.trial_id, handle.platform, {**handle.data, SERVICE_KEY: member.name})

    def abandon(self, trial_id: str) -> None:
        with self._lock:
            name = self._placed.pop(trial_id, None)
            if name is not None:
                self.members[name].running.discard(trial_id)

    def _member(self, handle: TrialHandle) -> Member:
        name = handle.data.get(SERVICE_KEY)
        if name not in self.members:
            raise PlatformError(f"trial {handle.trial_id} ran on training service {name!r}, which is not in this "
                                f"experiment's config (services: {', '.join(self.members)})")
        return self.members[name]

    def _release(self, member: Member, trial_id: str) -> None:
        with self._lock:
            member.running.discard(trial_id)
            self._placed.pop(trial_id, None)

    # ---- one trial, on its own member -----------------------------------------------------

    def poll(self, handle: TrialHandle, cursor: dict[str, Any]) -> TrialUpdate:
        member = self._member(handle)
        update = member.service.poll(handle, cursor)
        if update.status.is_terminal:
            self._release(member, handle.trial_id)
        return update

    def cancel(self, handle: TrialHandle, reason: Any) -> None:
        member = self._member(handle)
        member.service.cancel(handle, reason)
        self._release(member, handle.trial_id)

    def adopt(self, handle: TrialHandle) -> None:
        member = self._member(handle)
        with self._lock:
            member.running.add(handle.trial_id)
            self._placed[handle.trial_id] = member.name
        member.service.adopt(handle)

    def wait(self, handle: TrialHandle, timeout: float) -> None:
        self._member(handle).service.wait(handle, timeout)

    def use_report_desk(self, desk: ReportDesk) -> bool:
        """Members whose trials can reach the desk use it (every member is told)."""
        return any([m.service.use_report_desk(desk) for m in self.members.values()])

    def logs(self, handle: TrialHandle, tail: int | None = None) -> dict[str, str]:
        return self._member(handle).service.logs(handle, tail)

    def read_output(self, handle: TrialHandle, offsets: dict[str, int]) -> dict[str, bytes]:
        return self._member(handle).service.read_output(handle, offsets)

    def output_folder(self, handle: TrialHandle, name: str) -> Path | None:
        return self._member(handle).service.output_folder(handle, name)

    def clean(self, dry_run: bool = False) -> list[str]:
        return [where for member in self.members.values() for where in member.service.clean(dry_run)]

    def close(self) -> None:
        for member in self.members.values():
            try:
                member.service.close()
            except Exception as exc:  # noqa: BLE001 -- close the others all the same
                log.warning("closing %s failed: %s", member.label, exc)


def experiment_service(config: ExperimentConfig, experiment_dir: Path) -> TrainingService:
    """The experiment's training service: its one section's, or a :class:`HybridService` over a list."""
    if config.is_hybrid:
        return HybridService(config, experiment_dir)
    return create_service(config.services[0], experiment_dir)


def experiment_retry(config: ExperimentConfig) -> RetryPolicy:
    """How a submission is retried: its platform's policy (hybrid: the most patient member's)."""
    return max((platform(s.platform).retry for s in config.services), key=lambda r: sum(r.delays()))
