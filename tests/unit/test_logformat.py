"""`--log-format json`: one JSON object per line that log pipelines can filter on."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

from poolpilot import logformat


def test_a_json_line_carries_the_message_level_logger_and_extra_fields() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logformat.JsonFormatter())
    log = logging.getLogger("poolpilot.test.json")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.info("scaled %s to %d", "decode", 3, extra={"pool": "serving/llama", "replicas": 3})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "scaled decode to 3" and first["level"] == "INFO"
    assert first["logger"] == "poolpilot.test.json" and first["time"].endswith("Z")
    assert (first["pool"], first["replicas"]) == ("serving/llama", 3)
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


def test_every_command_takes_the_option() -> None:
    proc = subprocess.run([sys.executable, "-m", "poolpilot.cli", "validate", "--log-format",
                           "json", "--log-level", "INFO", "/nonexistent.yaml"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "nonexistent" in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "poolpilot.cli", "validate", "--log-format",
                          "xml", "x.yaml"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--log-format" in bad.stderr
