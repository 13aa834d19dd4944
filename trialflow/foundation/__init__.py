"""The foundations layer: what every layer above uses and that knows neither Prefect nor an experiment's
record -- the user-facing error, trial and experiment statuses, ids, values kept out of logs, paused
garbage collection and modules imported on first use during start-up, Optuna's logging, the
fingerprint of this installation's code, and the local user behind a TCP connection. Importing the
package imports none of its modules."""
