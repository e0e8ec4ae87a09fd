"""The prefetch program (operator/prefetch_script.py) with the real huggingface_hub of the vLLM
venv (the library the runtime image runs it with) against a Hub stand-in on 127.0.0.1
(HF_ENDPOINT): it fetches the repository into the folder the engines read, skips the weights
vLLM never loads, marks the folder complete, finds it complete the next time, and a refusal
ends it with one line saying why."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from poolpilot.operator import prefetch_script
from router_support import VLLM_PYTHON, vllm_available

pytestmark = [pytest.mark.adapter, pytest.mark.skipif(
    not vllm_available(), reason="needs the vLLM venv (./dev setup-vllm) for huggingface_hub")]

REPO = "org/tiny-8B"
SHA = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}',
         "model-00001-of-00002.safetensors": b"a" * 3000,
         "model-00002-of-00002.safetensors": b"b" * 2000,
         "tokenizer.json": b"{}",
         "pytorch_model.bin": b"c" * 5000,
         "original/consolidated.00.pth": b"d" * 5000}


class Hub(BaseHTTPRequestHandler):
    """The Hub's API as huggingface_hub 2.x calls it: repo info, the tree, resolve."""

    gated = False
    served: list[str] = []

    def log_message(self, *_: object) -> None:
        pass

    def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: object) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if self.gated:
            self._send(401, b'{"error": "Access to model org/tiny-8B is restricted."}',
                       {"Content-Type": "application/json", "X-Error-Code": "GatedRepo",
                        "X-Error-Message": "Access to model org/tiny-8B is restricted."})
            return
        if path == f"/api/models/{REPO}/revision/main":
            self._json({"id": REPO, "sha": SHA, "siblings": [{"rfilename": f} for f in FILES]})
        elif path.startswith(f"/api/models/{REPO}/tree/"):
            self._json([{"type": "file", "path": f, "size": len(b),
                         "oid": hashlib.sha1(b).hexdigest()} for f, b in FILES.items()])
        elif path.startswith(f"/{REPO}/resolve/"):
            name = path.split("/resolve/", 1)[1].split("/", 1)[1]
            body = FILES.get(name)
            if body is None:
                self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                return
            if self.command == "GET":
                self.served.append(name)
            self._send(200, body, {"X-Repo-Commit": SHA,
                                   "ETag": f'"{hashlib.sha256(body).hexdigest()}"'})
        else:
            self._send(404, b"", {})

    do_HEAD = do_GET


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def prefetch(hub: str, dest: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"HF_ENDPOINT": hub, "HF_HOME": str(home), "HOME": str(home),
           "HF_HUB_DISABLE_TELEMETRY": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(VLLM_PYTHON), prefetch_script.__file__, "--dest", str(dest),
                           "hf", "--repo", REPO], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_hub_fetch_fills_the_folder_once(hub: str, tmp_path: Path) -> None:
    dest = tmp_path / "model-cache" / "org--tiny-8B"
    first = prefetch(hub, dest, tmp_path / "home")
    assert first.returncode == 0, first.stderr
    got = {p.relative_to(dest).as_posix() for p in dest.rglob("*")
           if p.is_file() and ".cache" not in p.parts}
    # What vLLM loads, and the marker; not the .bin or original/ copies of the weights.
    assert got == {"config.json", "model-00001-of-00002.safetensors",
                   "model-00002-of-00002.safetensors", "tokenizer.json",
                   prefetch_script.MARKER}
    assert (dest / "model-00001-of-00002.safetensors").read_bytes() == FILES[
        "model-00001-of-00002.safetensors"]
    assert json.loads((dest / prefetch_script.MARKER).read_text())["source"] == \
        f"hf:{REPO}@main"
    Hub.served.clear()
    again = prefetch(hub, dest, tmp_path / "home")
    assert again.returncode == 0 and "already holds" in again.stdout
    assert Hub.served == []  # nothing downloaded twice


def test_a_refused_fetch_says_why_in_its_last_line(hub: str, tmp_path: Path) -> None:
    Hub.gated = True
    try:
        out = prefetch(hub, tmp_path / "m", tmp_path / "home")
    finally:
        Hub.gated = False
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"prefetch of hf:{REPO}@main failed: ") and "restricted" in last, last
    assert not (tmp_path / "m" / prefetch_script.MARKER).exists()
