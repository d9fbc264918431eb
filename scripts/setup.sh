#!/usr/bin/env bash
# Create the project's virtual environment in .venv (if missing) and install orch into it
# with its development tools. Safe to run again: it only installs what changed.
#
# torch is installed first, on its own: ORCH_TORCH_SPEC (default torch==2.13.0) and
# ORCH_TORCH_PIP_ARGS (for example an --index-url of PyTorch's CPU or CUDA wheels) choose
# the build, so that pip never picks one for you while resolving the other packages.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
# Found, not imported: importing torch takes a second or more, and this runs before every job.
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
  echo "setup: installing ${ORCH_TORCH_SPEC:-torch==2.13.0}"
  # shellcheck disable=SC2086
  .venv/bin/pip install --quiet ${ORCH_TORCH_PIP_ARGS:-} "${ORCH_TORCH_SPEC:-torch==2.13.0}"
fi
stamp=.venv/.orch-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing orch and its development tools"
  .venv/bin/pip install --quiet -e '.[dev]'
  touch "$stamp"
fi
