#!/usr/bin/env bash
# Regenerate orch/wire/_proto/ from protos/orchestrator.proto (needs grpcio-tools: pip install -e '.[dev]').
# Usage: scripts/generate_proto.sh [OUT_DIR]   (default: orch/wire/_proto; the staleness test passes a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-orch/wire/_proto}"
py="${PYTHON:-python}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && py=.venv/bin/python
mkdir -p "$out"
"$py" -m grpc_tools.protoc -I protos \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  protos/orchestrator.proto
# protoc writes a top-level import; the package needs a relative one.
sed -i 's/^import orchestrator_pb2 as orchestrator__pb2$/from . import orchestrator_pb2 as orchestrator__pb2/' \
  "$out/orchestrator_pb2_grpc.py"
