"""TLS as users deploy it: a certificate made for the host's name, not for 127.0.0.1."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509

import orch
from conftest import ORCH, make_certificate
from orch.wire.auth import certificate_name
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(240)

HOST_NAME = "orch-master.example"


@pytest.fixture
def host_certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for the host's DNS name only: 127.0.0.1 is not in it."""
    return make_certificate(tmp_path, HOST_NAME, [x509.DNSName(HOST_NAME)])


def test_the_name_a_certificate_carries(tmp_path: Path, host_certificate: tuple[Path, Path]) -> None:
    assert certificate_name(host_certificate[0]) == HOST_NAME
    cn_only, _ = make_certificate(tmp_path, "cn-only.example", [])
    assert certificate_name(cn_only) == "cn-only.example"
    assert certificate_name(tmp_path / "missing.pem") is None


def test_a_launch_with_a_certificate_for_the_host_name(
    tmp_path: Path, host_certificate: tuple[Path, Path]
) -> None:
    cert, key = host_certificate
    started = time.monotonic()
    with orch.launch(
        "jobs:allreduce_steps",
        world_size=2,
        steps=10,
        run_root=str(tmp_path),
        tls_cert=str(cert),
        tls_key=str(key),
    ) as run:
        result = run.wait(timeout=120)  # its workers and its own clients verified HOST_NAME
        assert result.state is RunState.SUCCEEDED
        # Dialled by address with no name to verify: refused, and the message says TLS.
        with pytest.raises(orch.MasterUnavailable, match="TLS"):
            orch.attach(run.address, token=run.token, tls_ca=str(cert), timeout=2)
        with pytest.raises(orch.MasterUnavailable, match="TLS"):
            orch.attach(run.address, token=run.token, timeout=2)  # plaintext to a TLS master
    print(f"\nTLS run with a host-name certificate: {time.monotonic() - started:.1f}s")


def test_orch_master_with_its_dashboard_and_a_host_namemake_certificate(
    tmp_path: Path, host_certificate: tuple[Path, Path], subprocess_env: dict[str, str]
) -> None:
    cert, key = host_certificate
    master = subprocess.Popen(
        [
            ORCH,
            "master",
            "--port",
            "0",
            "--world-size",
            "1",
            "--run-root",
            str(tmp_path),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--linger",
            "0",
            "--refresh",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env,
    )
    try:
        time.sleep(6.0)  # it used to exit within 5 s: its dashboard failed to verify 127.0.0.1
        assert master.poll() is None, master.communicate()[1]
        master.send_signal(signal.SIGINT)  # stop gracefully: no worker ever came
        out, err = master.communicate(timeout=60)
    finally:
        if master.poll() is None:
            master.kill()
            master.communicate()
    assert master.returncode == 3, err
    assert "waiting for 1 workers to register" in out  # the dashboard drew the run
    (result,) = tmp_path.glob("*/result.json")
    assert json.loads(result.read_text())["state"] == "STOPPED"
