"""trialflow's first experiment (``trialflow hello`` wrote this folder): ten trials of ``model.py``, two
at a time, tuned by TPE, started through NNI's Python API as an NNI user would start them.

    python3 nni_hello_hpo/main.py

Its progress shows in the terminal; Ctrl-C stops it (its running trials end USER_CANCELED). Afterwards
``trialflow experiment list --all`` lists it and ``trialflow trial ls ID`` its trials.
"""

from pathlib import Path

from nni.experiment import Experiment

search_space = {
    "lr": {"_type": "loguniform", "_value": [0.001, 1.0]},
    "momentum": {"_type": "uniform", "_value": [0.0, 0.95]},
    "batch_size": {"_type": "choice", "_value": [8, 16, 32, 64]},
}

experiment = Experiment("local")
experiment.config.experiment_name = "hello"
experiment.config.trial_command = "python3 model.py"
experiment.config.trial_code_directory = Path(__file__).parent
experiment.config.search_space = search_space
experiment.config.tuner.name = "TPE"
experiment.config.tuner.class_args = {"optimize_mode": "maximize"}
experiment.config.max_trial_number = 10
experiment.config.trial_concurrency = 2

if experiment.run():
    best = max((r for r in experiment.export_data() if r.value is not None), key=lambda r: r.value, default=None)
    if best is not None:
        print(f"best accuracy {best.value:.3f} from trial {best.trialJobId}: {best.parameter}")
