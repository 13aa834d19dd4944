"""Quickstart trial: a small pure-Python model (no extra packages) -- logistic regression on a
synthetic two-moons-like data set, trained with mini-batch SGD; reports validation accuracy per
epoch and at the end."""

from __future__ import annotations

import math
import random

from trialflow import trial


def make_data(n: int, seed: int) -> list[tuple[list[float], int]]:
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        label = rng.random() < 0.5
        angle = rng.uniform(0, math.pi)
        x = math.cos(angle) + (1.0 if label else 0.0) + rng.gauss(0, 0.2)
        y = math.sin(angle) * (-1 if label else 1) + (0.4 if label else 0.0) + rng.gauss(0, 0.2)
        data.append(([x, y, x * y, x * x, y * y], int(label)))
    return data


def accuracy(w: list[float], b: float, data: list[tuple[list[float], int]]) -> float:
    hits = sum((sum(wi * xi for wi, xi in zip(w, x)) + b > 0) == bool(t) for x, t in data)
    return hits / len(data)


def main() -> None:
    params = {"lr": 0.1, "batch_size": 16, "l2": 1e-4, "epochs": 8, "optimizer": {"_name": "sgd"}}
    params.update(trial.get_next_parameter() or {})
    train, valid = make_data(600, seed=1), make_data(300, seed=2)
    rng = random.Random(0)
    w, b, velocity = [0.0] * 5, 0.0, [0.0] * 6
    momentum = params["optimizer"].get("momentum", 0.0)
    for _ in range(int(params["epochs"])):
        rng.shuffle(train)
        for start in range(0, len(train), int(params["batch_size"])):
            batch = train[start:start + int(params["batch_size"])]
            grad = [0.0] * 6
            for x, t in batch:
                z = max(-30.0, min(30.0, sum(wi * xi for wi, xi in zip(w, x)) + b))
                err = 1 / (1 + math.exp(-z)) - t
                for i in range(5):
                    grad[i] += err * x[i] / len(batch) + params["l2"] * w[i]
                grad[5] += err / len(batch)
            velocity = [momentum * v - params["lr"] * g for v, g in zip(velocity, grad)]
            w = [wi + v for wi, v in zip(w, velocity[:5])]
            b += velocity[5]
        trial.report_intermediate_result(accuracy(w, b, valid))
    trial.report_final_result(accuracy(w, b, valid))


if __name__ == "__main__":
    main()
