"""The README's first command, verbatim, on a fresh clone: `git clone` this repository into an
empty folder and run the `./dev sandbox` line of README.md's "Two commands" block there, as a
new user would (it creates its own venv, installs kubectl and helm, starts everything), then
read `sandbox-report/report.json`.

It is the README's run in full: the whole default trace, and what README.md and docs/sandbox.md
promise of it (at least 90% of the requests within the SLO, a scale-up and a scale-down, local
prefills during the bursts). The clone is of the committed HEAD (run it after committing).
Cost: the clone's venv (poolpilot's runtime dependencies; pip takes the wheels from its cache
or the local mirror) and one default sandbox run, about four minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from poolpilot.engine_sim.traces import load_trace
from poolpilot.sandbox.data import DEFAULT_TRACE

ROOT = Path(__file__).resolve().parents[1]


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
    tools off PATH, no venv activated, no POOLPILOT_* settings."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(ROOT)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("POOLPILOT_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "PATH": os.pathsep.join(path)}


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
    assert requests["sent"] == len(load_trace(DEFAULT_TRACE)), requests  # the whole trace
    assert requests["ok"] == requests["sent"] and requests["failed"] == 0, requests
    assert report["ttft_seconds"]["p90"] > 0 and report["replica_seconds"]["prefill"] > 0
    # What a user reads: the attainment, the scale events and the local-prefill fallbacks.
    assert report["slo_attainment"] >= 0.9 and "SLO met: " in out, report["slo_attainment"]
    moves = {(e["role"], e["to"] > e["from"]) for e in report["scale_events"]}
    assert {("prefill", True), ("prefill", False)} <= moves and "scale events" in out, moves
    assert report["local_prefill"]["by_reason"]["prefill_behind"] > 0
    rows = (clone / "sandbox-report" / "requests.csv").read_text().splitlines()
    assert len(rows) == 1 + requests["sent"]
    assert {p.name for p in report_file.parent.glob("*.png")} == {
        "ttft.png", "queue.png", "replicas.png", "request_rate.png", "local_prefill.png",
        "prefix_cache.png"}
    assert "creating" in out and f"{clone}/.venv" in out  # it made its own venv
    assert f"report: {report_file}" in out
    shutil.rmtree(clone, ignore_errors=True)  # the venv: a few hundred MB
