#!/usr/bin/env bash
# Register Frenzy's deployments with the Prefect server at $PREFECT_API_URL (a `prefect server start`, or Cloud).
# Run from anywhere; it works from the repository root, which becomes each run's working directory. Creates the
# process work pool "frenzy" when it is missing. Afterwards start a worker:  prefect worker start --pool frenzy
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PREFECT_API_URL:-}" ] && ! prefect config view 2>/dev/null | grep -q PREFECT_API_URL; then
  echo "deploy.sh: PREFECT_API_URL is not set; start a server (prefect server start) and" \
       "run: prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api" >&2
  exit 2
fi
prefect work-pool inspect frenzy >/dev/null 2>&1 || prefect work-pool create frenzy --type process
prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml
