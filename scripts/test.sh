#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy --strict on orch/), the layers
# (lint-imports), then pytest over tests/ and, through nbmake, every notebook in notebooks/,
# on several pytest-xdist workers (ORCH_TEST_WORKERS, default 2, one per core of these
# machines: with a third, real ranks of three tests at once were starved often enough for a
# gloo group set-up or a gang's peer to miss its moment about once a run), then the
# tests whose verdict is a timing (marked serial in tests/conftest.py) alone.
#
#   scripts/test.sh --quick    lint, types, layers and the unit tests: no real processes
#
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy orch
echo "== lint-imports"
.venv/bin/lint-imports --no-cache | sed -n '/^Contracts/,$p'
echo "== pytest"
if [ "$quick" = 1 ]; then
  exec .venv/bin/python -m pytest -m unit -p no:cacheprovider -q "$@"
fi
# The parallel part, then the tests whose verdict is a timing, alone (tests/conftest.py).
# pytest exits 5 when it ran no test: that is an error only when neither part ran one.
parallel=0 alone=0
.venv/bin/python -m pytest -n "${ORCH_TEST_WORKERS:-2}" --dist loadgroup -m "not serial" "$@" || parallel=$?
echo "== pytest, alone on the machine: the timing tests"
.venv/bin/python -m pytest -m serial "$@" || alone=$?
if [ "$parallel" = 5 ] && [ "$alone" = 5 ]; then exit 5; fi
for code in "$parallel" "$alone"; do
  if [ "$code" != 0 ] && [ "$code" != 5 ]; then exit "$code"; fi
done
