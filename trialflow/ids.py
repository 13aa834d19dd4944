"""Identifiers in NNI's formats: experiment ids of 8 distinct [a-z0-9] characters, trial ids of 5
characters starting with a letter."""

from __future__ import annotations

import secrets
import string

_LOWER_DIGITS = string.ascii_lowercase + string.digits
_LETTERS = string.ascii_letters
_ALNUM = string.ascii_letters + string.digits


def new_experiment_id() -> str:
    chars = list(_LOWER_DIGITS)
    out = []
    for _ in range(8):
        out.append(chars.pop(secrets.randbelow(len(chars))))
    return "".join(out)


def new_trial_id() -> str:
    return secrets.choice(_LETTERS) + "".join(secrets.choice(_ALNUM) for _ in range(4))
