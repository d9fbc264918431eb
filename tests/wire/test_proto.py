"""The generated code committed in orch/wire/_proto must match protos/orchestrator.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_committed_generated_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "generate_proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    names = ["orchestrator_pb2.py", "orchestrator_pb2.pyi", "orchestrator_pb2_grpc.py"]
    committed = ROOT / "orch" / "wire" / "_proto"
    stale = [n for n in names if (tmp_path / n).read_text() != (committed / n).read_text()]
    assert not stale, f"run scripts/generate_proto.sh and commit the result: {stale} differ"
