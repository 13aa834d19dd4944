"""A wrong ``tracking`` section is refused at create in one line that names the fix (and never echoes a
password). Pure: no server, no tracker."""

from __future__ import annotations

import pytest

from tests.conftest import base_config
from trialflow import parse_config
from trialflow.config import ConfigError


@pytest.mark.parametrize("tracking,says", [
    ({"mlflow": {"trackingUri": "http://admin:pw@127.0.0.1:5000"}}, "trackingUri holds a password"),
    ({"mlfow": {"trackingUri": "http://127.0.0.1:5000"}}, "mlflow"),
    ({"mlflow": {"experimentName": "x"}}, "trackingUri"),
    ({"wandb": {"project": "p", "credentials": "my-key"}}, "credentials are for mode: online"),
    ({"wandb": {"mode": "offline"}}, "project"),
    ({"wandb": {"project": "p", "mode": "shared"}}, "mode"),
])
def test_a_wrong_tracking_section_is_one_line_naming_the_fix(tmp_path, tracking, says):
    (tmp_path / "code").mkdir()
    with pytest.raises(ConfigError) as caught:
        parse_config(base_config(tmp_path / "code", tmp_path / "w", tracking=tracking))
    assert len(caught.value.problems) == 1 and says in caught.value.problems[0], caught.value.problems
    assert "pw@" not in str(caught.value)
