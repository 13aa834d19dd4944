"""Where a hybrid experiment places its trials: the member with the most weighted free capacity, ties
to the one running fewer, then to the earlier section; a freed slot draws the next trial back. Driven
through HybridService's own placement calls on real local members, with no trial started, so the
rule is checked without depending on how fast each platform runs its trials."""

from __future__ import annotations

import pytest

from tests.conftest import base_config
from trialflow import parse_config
from trialflow.platforms.base import TransientPlatformError
from trialflow.platforms.hybrid import HybridService


def _service(tmp_path, *sections, concurrency=6) -> HybridService:
    (tmp_path / "code").mkdir(exist_ok=True)
    config = base_config(tmp_path / "code", tmp_path / "w", trialConcurrency=concurrency,
                         trainingService=[{"platform": "local", **s} for s in sections])
    return HybridService(parse_config(config), tmp_path / "w" / "exp")


def _place(service: HybridService, *trial_ids: str) -> list[str]:
    """The member each trial is placed on, in order (a placement holds its slot until abandoned)."""
    placed = []
    for sequence, trial_id in enumerate(trial_ids):
        spec = service.trial_spec("exp", trial_id, sequence, sequence, {"x": 0.5})
        placed.append(next(m.name for m in service.members.values() if spec.trial_id in m.running))
    return placed


def test_equal_members_take_turns_and_a_freed_slot_draws_the_next_trial(tmp_path):
    service = _service(tmp_path, {}, {}, {})
    try:
        assert _place(service, *"abcdef") == ["local", "local#2", "local#3"] * 2
        service.abandon("b")  # a trial on local#2 ended: it has the most room now
        service.abandon("e")
        assert _place(service, "g", "h") == ["local#2", "local#2"]
    finally:
        service.close()


def test_weight_scales_the_share_and_max_concurrency_caps_it(tmp_path):
    service = _service(tmp_path, {"maxConcurrency": 2}, {"maxConcurrency": 4, "weight": 2}, concurrency=6)
    try:
        # weighted room (local, local#2): 2|8, 2|6, 2|4, 2|2 (tie: fewer running), 1|2, 1|0 (full)
        assert _place(service, *"abcdef") == ["local#2"] * 3 + ["local", "local#2", "local"]
        with pytest.raises(TransientPlatformError, match="maxConcurrency"):
            _place(service, "g")
    finally:
        service.close()


def test_members_without_max_concurrency_follow_the_concurrency_in_force(tmp_path):
    service = _service(tmp_path, {}, {"maxConcurrency": 1}, concurrency=1)
    try:
        assert _place(service, "a", "b") == ["local", "local#2"]
        with pytest.raises(TransientPlatformError):
            _place(service, "c")
        service.follow_concurrency(3)  # trialflow update concurrency 3: local's cap; local#2 keeps its own
        assert _place(service, "c", "d") == ["local", "local"]
        with pytest.raises(TransientPlatformError):
            _place(service, "e")
        service.follow_concurrency(1)  # lowered: local keeps its trials and takes no new one under 1
        service.abandon("a")
        service.abandon("b")
        assert _place(service, "e") == ["local#2"]
        with pytest.raises(TransientPlatformError):
            _place(service, "f")
    finally:
        service.close()
