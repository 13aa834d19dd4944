"""``nni.experiment.config``: NNI's config objects (``ExperimentConfig``, ``AlgorithmConfig``, ``LocalConfig``,
``RemoteConfig``, ``KubeflowConfig``, ...), where NNI's own code and tests import them from: the config objects
``nni.experiment`` gives (``trialflow.nni_python_api``), imported with this package (never inside a trial)."""

from __future__ import annotations

import trialflow

_api = trialflow.nni_python_api
__all__ = [name for name in _api.__all__ if name.endswith("Config") or name == "FrameworkAttemptCompletionPolicy"]
globals().update({name: getattr(_api, name) for name in __all__})
