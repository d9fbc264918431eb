#!/usr/bin/env bash
# The main job: a master and 4 DDP workers on this machine, training the built-in digits
# example, with the live terminal dashboard. Extra arguments go to `orch run`
# (for example --steps 500 or --workers 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/orch run --workers 4 "$@"
