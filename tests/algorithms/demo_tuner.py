"""A customized tuner and assessor written against NNI's API only, as an NNI user writes them
(nni.tuner.Tuner, nni.assessor.Assessor, nni.utils); every call is appended to ``log_file``."""

import json

import nni
from nni.assessor import Assessor, AssessResult
from nni.tuner import Tuner
from nni.utils import ClassArgsValidator, OptimizeMode, extract_scalar_reward


def _log(path, **entry):
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


class CyclingTuner(Tuner):
    """Hands out the values of a space in NNI's BatchTuner-like format of its own ("_type": "cycle"),
    one per trial, and stops with NoMoreTrialError after ``limit`` trials."""

    def __init__(self, log_file, optimize_mode="maximize", limit=100, fail_on=None):
        self.log_file = log_file
        self.mode = OptimizeMode(optimize_mode)
        self.limit = limit
        self.fail_on = fail_on
        self.values = []
        self.given = 0

    def update_search_space(self, search_space):
        self.values = search_space["x"]["_value"]
        _log(self.log_file, call="update_search_space", space=search_space)

    def generate_parameters(self, parameter_id, **kwargs):
        if self.fail_on == "generate_parameters" and self.given == 2:
            raise RuntimeError("generate exploded")
        if self.given >= self.limit:
            raise nni.NoMoreTrialError("all values handed out")
        self.given += 1
        return {"x": self.values[parameter_id % len(self.values)], "id": parameter_id}

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        reward = extract_scalar_reward(value)
        if self.fail_on == "receive_trial_result":
            raise ZeroDivisionError("receive exploded")
        _log(self.log_file, call="receive_trial_result", parameter_id=parameter_id, parameters=parameters,
             value=value, reward=reward)

    def trial_end(self, parameter_id, success, **kwargs):
        _log(self.log_file, call="trial_end", parameter_id=parameter_id, success=success)

    def import_data(self, data):
        _log(self.log_file, call="import_data", data=data)


class CyclingValidator(ClassArgsValidator):
    def validate_class_args(self, **kwargs):
        if "log_file" not in kwargs:
            raise ValueError("log_file is required")
        if kwargs.get("optimize_mode", "maximize") not in ("maximize", "minimize"):
            raise ValueError(f"optimize_mode should be maximize or minimize, not {kwargs['optimize_mode']!r}")
        unknown = set(kwargs) - {"log_file", "optimize_mode", "limit", "fail_on"}
        if unknown:
            raise ValueError(f"unknown classArgs {sorted(unknown)}")


class ThresholdAssessor(Assessor):
    """Bad as soon as an intermediate result exceeds ``above``."""

    def __init__(self, above, log_file):
        self.above = above
        self.log_file = log_file

    def assess_trial(self, trial_job_id, trial_history):
        _log(self.log_file, call="assess_trial", trial=trial_job_id, history=trial_history)
        return AssessResult.Bad if trial_history[-1] > self.above else AssessResult.Good

    def trial_end(self, trial_job_id, success):
        _log(self.log_file, call="assessor_trial_end", trial=trial_job_id, success=success)
