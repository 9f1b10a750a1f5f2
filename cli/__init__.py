"""The `frenzy` command line: one module per command group (plan, cluster, train, stragglers, submit, diagnose,
evaluate, data, catalog), all answering through cli/output.py. The entry point is `cli.main:main`."""
