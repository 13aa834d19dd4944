"""A customized tuner and assessor that keep state in NNI's checkpoint folder the way NNI's API offers
it (``get_checkpoint_path``, ``save_checkpoint``, ``load_checkpoint``); every call is appended to
``log_file`` with what NNI's dispatcher variables said then."""

import json
import os

from nni.assessor import Assessor, AssessResult
from nni.tuner import Tuner


def _log(log_file, **entry):
    entry.update(mode=os.environ.get("NNI_MODE"), env_dir=os.environ.get("NNI_CHECKPOINT_DIRECTORY"))
    with open(log_file, "a") as f:
        f.write(json.dumps(entry) + "\n")


class SavingTuner(Tuner):
    """x = 1, 2, 3, ... in order; the results received so far are saved after each one."""

    def __init__(self, log_file):
        super().__init__()
        self.log_file = log_file
        self.results = {}

    def load_checkpoint(self):
        path = self.get_checkpoint_path()
        with open(os.path.join(path, "tuner.json")) as f:
            self.results = json.load(f)
        _log(self.log_file, call="load_checkpoint", path=path, results=self.results)

    def save_checkpoint(self):
        with open(os.path.join(self.get_checkpoint_path(), "tuner.json"), "w") as f:
            json.dump(self.results, f)

    def update_search_space(self, search_space):
        _log(self.log_file, call="update_search_space", path=self.get_checkpoint_path())

    def generate_parameters(self, parameter_id, **kwargs):
        return {"x": parameter_id + 1}

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        self.results[str(parameter_id)] = value
        self.save_checkpoint()


class LoadingAssessor(Assessor):
    def __init__(self, log_file):
        super().__init__()
        self.log_file = log_file

    def load_checkpoint(self):
        _log(self.log_file, call="assessor_load_checkpoint", path=self.get_checkpoint_path())

    def assess_trial(self, trial_job_id, trial_history):
        return AssessResult.Good
