"""The application layer, under the command line and the Python API users call: the Python API itself,
experiment control (stop, kill, update, a resumed run's preparation), background and spare controllers,
and experiment save and load. Importing the package imports none of its modules: a background
controller starts with ``python -m trialflow.app.controller_launch``."""
