"""An unchanged NNI trial with several objectives: an MLP on scikit-learn's digits, reporting after each
epoch its held-out accuracy, its size (thousands of parameters) and its memory (parameters and one
batch's activations, kB)."""

import warnings

import nni
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

EPOCHS = 9

p = nni.get_next_parameter()
x, y = load_digits(return_X_y=True)
x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.25, random_state=0)
layers = (p["width"],) * p["depth"]
model = MLPClassifier(hidden_layer_sizes=layers, alpha=p["alpha"], learning_rate_init=p["lr"],
                      batch_size=p["batch"], random_state=0)
result = {}
for epoch in range(EPOCHS):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one pass is not convergence, and is not meant to be
        model.partial_fit(x_train, y_train, classes=list(range(10)))
    accuracy = float(model.score(x_test, y_test))
    params = sum(w.size for w in model.coefs_) + sum(b.size for b in model.intercepts_)
    result = {"default": accuracy, "accuracy": accuracy, "size_k": params / 1000,
              "memory_kb": (params + p["batch"] * sum(layers)) * 8 / 1000}
    nni.report_intermediate_result(result)
nni.report_final_result(result)
