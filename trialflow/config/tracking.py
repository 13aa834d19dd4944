"""The config's ``tracking`` section: the MLflow server and W&B project the experiment's record is
logged to (each checked for its package and for a password written into the config)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from ._base import ConfigModel


class MlflowTrackingConfig(ConfigModel):
    """An MLflow tracking server the experiment is logged to: the experiment one parent run, each
    ended trial a nested run (``pip install 'trialflow[mlflow]'``)."""

    tracking_uri: str = Field(min_length=1, description="the tracking server, e.g. http://127.0.0.1:5000")
    experiment_name: str | None = Field(default=None, description="MLflow experiment the runs go to; default: "
                                        "the experimentName, else trialflow")
    credentials: str | None = Field(default=None, description="name of a trialflow MLflow credentials block "
                                    "(token, or user name and password)")

    @model_validator(mode="after")
    def _installed(self) -> MlflowTrackingConfig:
        if urlsplit(self.tracking_uri).password is not None:
            raise ValueError("trackingUri holds a password: save the login in an MLflowCredentials block and name "
                             "it in credentials")
        _require_installed("mlflow", "MLflow")
        return self


class WandbTrackingConfig(ConfigModel):
    """Weights & Biases runs the experiment is logged to: each ended trial a run and the experiment one
    more, grouped by the experiment; their files in the experiment's folder under ``wandb/``
    (``pip install 'trialflow[wandb]'``)."""

    project: str = Field(min_length=1, description="W&B project the runs go to")
    mode: Literal["offline", "online"] = Field(default="offline", description="offline: files only, sent later "
                                                 "with `wandb sync`; online: sent as they are logged")
    entity: str | None = Field(default=None, description="W&B team or user; default: the login's")
    credentials: str | None = Field(default=None, description="name of a trialflow W&B credentials block (API "
                                    "key); default in online mode: the login of `wandb login`")

    @model_validator(mode="after")
    def _installed(self) -> WandbTrackingConfig:
        if self.credentials and self.mode == "offline":
            raise ValueError("tracking.wandb: credentials are for mode: online (offline runs are sent later "
                             "with `wandb sync`)")
        _require_installed("wandb", "W&B")
        return self


class TrackingConfig(ConfigModel):
    """Experiment trackers the record is logged to, by the controller (trial code unchanged)."""

    mlflow: MlflowTrackingConfig | None = None
    wandb: WandbTrackingConfig | None = None


def _require_installed(tracker: str, name: str) -> None:
    """Raise ValueError naming the pip extra when the package of ``tracker`` (its module, extra and config
    key alike: ``mlflow``, ``wandb``) is not installed."""
    import importlib.util

    if importlib.util.find_spec(tracker) is None:
        raise ValueError(f"{name} is not installed: pip install 'trialflow[{tracker}]', or remove tracking.{tracker}")
