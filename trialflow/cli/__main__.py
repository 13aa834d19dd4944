"""``python -m trialflow.cli``: the command line, as the ``trialflow`` console script runs it."""

from . import main

main()
