"""``nni.experiment``: NNI's Python API for starting and watching experiments (``Experiment``, its config
objects and the records its queries return), run by trialflow: its public ``trialflow.nni_python_api``
(:mod:`trialflow.app.nni_experiment`), imported with this package (never inside a trial)."""

from __future__ import annotations

import trialflow

_api = trialflow.nni_python_api
__all__ = list(_api.__all__)
globals().update({name: getattr(_api, name) for name in __all__})
