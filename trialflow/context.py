"""Shared state of one running experiment, handed to its tasks (never pickled: the flow runs tasks in
threads, and tasks use ``cache_policy=NO_CACHE``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .assessors import Assessor
from .config import ExperimentConfig
from .platforms import TrainingService, TrialStatus
from .store import ExperimentStore
from .tuners import Tuner


@dataclass
class ExperimentContext:
    experiment_id: str
    experiment_dir: Path
    config: ExperimentConfig
    store: ExperimentStore
    service: TrainingService
    tuner: Tuner
    assessor: Assessor | None = None
    poll_interval: float = 0.2
    max_trial_duration: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    tuner_lock: threading.Lock = field(default_factory=threading.Lock)
    cancel_requests: dict[str, TrialStatus] = field(default_factory=dict)
    # parameter id -> raw values of trials taken over from an earlier run (resume)
    adopted: dict[int, dict[str, Any]] = field(default_factory=dict)
    # trials whose end is recorded (and told to the tuner): their slot in the window is free even
    # while their task run is still closing; ``slot_freed`` wakes the experiment loop
    ended: set[str] = field(default_factory=set)
    slot_freed: threading.Event = field(default_factory=threading.Event)

    def trial_ended(self, trial_id: str) -> None:
        self.ended.add(trial_id)
        self.slot_freed.set()

    def request_cancel(self, trial_id: str, reason: TrialStatus) -> None:
        self.cancel_requests.setdefault(trial_id, reason)
