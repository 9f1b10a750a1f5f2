"""The `frenzy` command line: one module per command group (plan, cluster, train, stragglers, submit, diagnose,
evaluate, data, catalog), all answering through cli/output.py. The entry point is `cli.main:main`."""

import flows  # noqa: F401, E402 - Frenzy's defaults for Prefect's settings, before any command imports Prefect
