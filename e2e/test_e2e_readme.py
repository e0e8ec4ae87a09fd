"""The README's first command, verbatim, on a fresh clone: `git clone` this repository into an
empty folder and run the `./dev sandbox` line of README.md's "Two commands" block there, as a
new user would (it creates its own venv, installs kubectl and helm, starts everything), then
read `sandbox-report/report.json`.

The only difference from the README's run is its length: POOLPILOT_SANDBOX_DURATION (documented
in docs/sandbox.md) shortens the replayed trace; no flag is added. The clone is of the
committed HEAD (run it after committing). Cost: the clone's venv (poolpilot's runtime
dependencies; pip takes the wheels from its cache or the local mirror) and one short sandbox.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATION_S = "60"  # simulated seconds of the default trace: its lead-in, the rise and the
# burst's first seconds, about 270 requests


def readme_sandbox_command() -> str:
    """The `./dev sandbox` line of the README's "Two commands" block, without its comment."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Two commands on a fresh machine\n+```bash\n(.*?)```", text, re.S)
    assert block, "README.md lost its 'Two commands on a fresh machine' block"
    commands = [line.split("#")[0].strip() for line in block[1].splitlines()
                if line.startswith("./dev sandbox")]
    assert len(commands) == 1, block[1]
    return commands[0]


def fresh_user_env(home: Path) -> dict[str, str]:
    """This environment without anything the test suite's own checkout put there: its venv and
    tools off PATH, no venv activated, no POOLPILOT_* settings but the run's length."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(ROOT)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("POOLPILOT_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "PATH": os.pathsep.join(path), "POOLPILOT_SANDBOX_DURATION": DURATION_S}


def test_readme_sandbox_command_works_on_a_fresh_clone(tmp_path: Path) -> None:
    command = readme_sandbox_command()
    assert command == "./dev sandbox"  # the README's words; a flag here would not be verbatim
    clone = tmp_path / "poolpilot"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    r = subprocess.run(["bash", "-c", command], cwd=clone, env=fresh_user_env(tmp_path),
                       capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    report_file = clone / "sandbox-report" / "report.json"  # the default, relative --report
    report = json.loads(report_file.read_text())
    requests = report["requests"]
    assert requests["sent"] >= 100 and requests["ok"] == requests["sent"], requests
    assert requests["failed"] == 0
    assert report["ttft_seconds"]["p90"] > 0 and report["replica_seconds"]["prefill"] > 0
    # What a user reads: the attainment, the scale events and the local-prefill fallbacks.
    assert 0 <= report["slo_attainment"] <= 1 and "SLO met: " in out
    assert isinstance(report["scale_events"], list) and "scale events" in out
    assert set(report["local_prefill"]["by_reason"]) >= {"prefill_behind"}
    assert {p.name for p in report_file.parent.glob("*.png")} == {
        "ttft.png", "queue.png", "replicas.png", "request_rate.png", "local_prefill.png"}
    assert "creating" in out and f"{clone}/.venv" in out  # it made its own venv
    assert f"report: {report_file}" in out
    shutil.rmtree(clone, ignore_errors=True)  # the venv: a few hundred MB
