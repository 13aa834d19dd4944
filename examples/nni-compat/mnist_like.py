"""Trial code written for NNI, unchanged: ``import nni`` works because trialflow puts its NNI
compatibility package on the trial's PYTHONPATH (NNI itself is not installed)."""

import math
import random

import nni


def train(params):
    rng = random.Random(params["seed"])
    loss = 2.5
    for epoch in range(params["epochs"]):
        loss *= 1 - params["learning_rate"] * (1 - params["dropout_rate"]) * 0.8
        loss += rng.gauss(0, 0.01)
        accuracy = 1 - loss / 2.5 * (1 - 0.1 * math.log2(params["hidden_size"] / 64))
        nni.report_intermediate_result({"default": accuracy, "loss": loss, "epoch": epoch})
    return accuracy


if __name__ == "__main__":
    params = {"learning_rate": 0.1, "dropout_rate": 0.5, "hidden_size": 128, "epochs": 5, "seed": 0}
    params.update(nni.get_next_parameter())
    nni.report_final_result(train(params))
