"""trialflow's kept local Prefect server (its start, its app, the seeded databases, its UI pages), which
Prefect API a process reports to, the caps on a platform's trials across experiments (Prefect's global
concurrency limits), and the spare controller's record in the server's folder. Importing the package
imports none of its modules: the console script reaches the server before any heavy import."""
