"""`poolpilot emulator` as its own process, and `cluster_from_env` choosing emulator vs real
cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from poolpilot.testkit.cluster import ENV, cluster_from_env, real_kubeconfig

pytestmark = pytest.mark.adapter

ROOT = Path(__file__).resolve().parents[2]


def test_cli_serves_preloads_crds_writes_a_kubeconfig_and_stops_on_sigterm(
        tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolpilot.cli", "emulator", "--port", "0",
         "--write-kubeconfig", str(kubeconfig), "--namespace", "serving",
         "--crd", str(ROOT / "crds/inferencepool.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once serving
        assert url.startswith("http://127.0.0.1:")
        config = yaml.safe_load(kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == url
        assert config["contexts"][0]["context"]["namespace"] == "serving"
        with urllib.request.urlopen(f"{url}/apis/poolpilot.dev/v1alpha1", timeout=10) as resp:
            names = [r["name"] for r in json.load(resp)["resources"]]
        assert "inferencepools" in names
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    assert code == 0


def test_cli_reports_a_port_in_use(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import socket

    from poolpilot.emulator import main as emulator_main

    parser = argparse.ArgumentParser()
    emulator_main.add_arguments(parser)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = emulator_main.run(parser.parse_args(["--port", str(port)]))
    assert code == 1
    assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err


def test_cluster_from_env_starts_an_emulator_by_default(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with cluster_from_env(tmp_path, namespace="ops") as (kubeconfig, emu):
        assert emu is not None
        config = yaml.safe_load(kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == emu.url
        with urllib.request.urlopen(f"{emu.url}/version", timeout=10) as resp:
            assert json.load(resp)["major"] == "1"


def test_cluster_from_env_uses_a_real_cluster_when_given_a_kubeconfig(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real-kubeconfig"
    real.write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv(ENV, str(real))
    with cluster_from_env(tmp_path) as (kubeconfig, emu):
        assert (kubeconfig, emu) == (real, None)
    monkeypatch.delenv(ENV)
    with cluster_from_env(tmp_path, kubeconfig=real) as (kubeconfig, emu):
        assert (kubeconfig, emu) == (real, None)


def test_missing_real_kubeconfig_is_a_clear_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=f"{ENV}=.*nope: no such kubeconfig"):
        real_kubeconfig()
    assert os.environ[ENV].endswith("nope")
