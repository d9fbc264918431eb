#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy --strict on orch/), then pytest over
# tests/ and, through nbmake, every notebook in notebooks/. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy orch
echo "== pytest"
exec .venv/bin/python -m pytest "$@"
