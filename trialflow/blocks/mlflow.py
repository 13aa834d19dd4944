"""Prefect block holding an MLflow tracking server's login: a token, or a user name and password.

A ``tracking.mlflow`` section names it with ``credentials: <block name>``::

    MLflowCredentials(token="...").save("tracking")
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, model_validator


class MLflowCredentials(Block):
    """A bearer token, or a user name and password (basic authentication), for an MLflow tracking server."""

    _block_type_name = "trialflow MLflow Credentials"
    _block_type_slug = "trialflow-mlflow-credentials"
    _description = "Token or user name and password of the MLflow tracking server trialflow logs experiments to."

    token: SecretStr | None = Field(default=None, description="bearer token (MLFLOW_TRACKING_TOKEN)")
    username: str | None = Field(default=None, description="user of basic authentication (MLFLOW_TRACKING_USERNAME)")
    password: SecretStr | None = Field(default=None, description="that user's password (MLFLOW_TRACKING_PASSWORD)")

    @model_validator(mode="after")
    def _one_login(self) -> MLflowCredentials:
        if (self.token is None) == (self.username is None or self.password is None):
            raise ValueError("give a token, or a username and a password")
        return self

    def environment(self) -> dict[str, str]:
        """The variables MLflow's client reads its login from."""
        if self.token is not None:
            return {"MLFLOW_TRACKING_TOKEN": self.token.get_secret_value()}
        assert self.username is not None and self.password is not None
        return {"MLFLOW_TRACKING_USERNAME": self.username, "MLFLOW_TRACKING_PASSWORD": self.password.get_secret_value()}
