"""The records layer: an experiment's store (its records, tables, database engine and the read-only
reader of the commands that only look), the search space, the trial code bundle and the disk-space
checks. No Prefect. Importing the package imports none of its modules."""
