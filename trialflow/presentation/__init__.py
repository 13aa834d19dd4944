"""What people look at, apart from the Prefect UI artifacts the experiment flow publishes
(``flows.artifacts``): the CLI's tables (``views``), the live progress of a foreground run
(``live``), the HTML report (``report``), the live optuna-dashboard and its Optuna mirror
(``dashboard``, ``optuna_mirror``) and TensorBoard (``tensorboard``). These modules read the store and
the results, and ``live`` runs the flow; nothing below them imports them."""
