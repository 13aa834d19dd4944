"""One trial of ``trialflow hello``'s experiment: a logistic regression that tells the inner of two noisy
rings from the outer one, trained for five epochs by mini-batch SGD with momentum, in plain Python. It
reads its hyperparameters with ``nni.get_next_parameter()`` and reports the validation accuracy after
each epoch and at the end: too small a learning rate leaves it at chance, a good one near 0.87."""

import math
import random

import nni


def make_data(n, seed):
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        inner = rng.random() < 0.5
        radius, angle = rng.gauss(0.7 if inner else 1.3, 0.25), rng.uniform(0, 2 * math.pi)
        x, y = radius * math.cos(angle), radius * math.sin(angle)
        data.append(((x, y, x * x, y * y), int(inner)))
    return data


def accuracy(w, b, data):
    return sum((sum(wi * xi for wi, xi in zip(w, x, strict=True)) + b > 0) == bool(t) for x, t in data) / len(data)


params = {"lr": 0.01, "momentum": 0.0, "batch_size": 32}
params.update(nni.get_next_parameter() or {})
train, valid = make_data(400, seed=1), make_data(200, seed=2)
w, b, velocity = [0.0] * 4, 0.0, [0.0] * 5
size = int(params["batch_size"])
for _epoch in range(5):
    for start in range(0, len(train), size):
        batch = train[start:start + size]
        grad = [0.0] * 5
        for x, t in batch:
            z = max(-30.0, min(30.0, sum(wi * xi for wi, xi in zip(w, x, strict=True)) + b))
            err = 1 / (1 + math.exp(-z)) - t
            for i in range(4):
                grad[i] += err * x[i] / len(batch)
            grad[4] += err / len(batch)
        velocity = [params["momentum"] * v - params["lr"] * g for v, g in zip(velocity, grad, strict=True)]
        w = [wi + v for wi, v in zip(w, velocity[:4], strict=True)]
        b += velocity[4]
    nni.report_intermediate_result(accuracy(w, b, valid))
nni.report_final_result(accuracy(w, b, valid))
