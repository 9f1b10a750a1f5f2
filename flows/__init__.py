"""Prefect flows of the pipeline. Importing this package sets Frenzy's defaults for Prefect's settings, which Prefect
reads once, when it is first imported: so `frenzy` (cli/__init__.py imports this first) and a notebook that imports a
flow before Prefect get them."""

import os

# Prefect's server sends a usage heartbeat. Offline (a laptop, a cluster without egress) every run logged "Failed to
# send telemetry", and the first run's ephemeral server raced it into a 110-line "database is locked" traceback.
# Off unless the user opts in: PREFECT_SERVER_ANALYTICS_ENABLED=true (a server of their own keeps its own setting).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Prefect's embedded (ephemeral) API server is given 20 s to start; on a loaded machine its first start takes longer
# (a demo on a busy 2-core host failed there with no hint). Two minutes, unless the user set it.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
