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


def looks_like_experiment_id(text: str) -> bool:
    return len(text) == 8 and all(c in _LOWER_DIGITS for c in text)


def new_trial_id() -> str:
    return secrets.choice(_LETTERS) + "".join(secrets.choice(_ALNUM) for _ in range(4))


def lowercase_id(ident: str) -> str:
    """A trial or environment id as a lowercase name part (Kubernetes object names, Azure ML job
    names). NNI lowercased ids, which can make two ids of one experiment collide (``aBcde``/``abcde``);
    the case of each letter is kept in a hex suffix."""
    mask = sum(1 << i for i, c in enumerate(ident) if c.isupper())
    return ident.lower() + (f"{mask:02x}" if any(c.isalpha() for c in ident) else "")
