"""Fetch a model's files into a folder once: the program the prefetch Job, the prefetcher
DaemonSet and the EmptyDir fetcher run in the runtime image (with vLLM's own interpreter).

The operator ships this file's text in the pool's NAME-prefetch ConfigMap, so it must stand
alone: the standard library, plus huggingface_hub or boto3 (both in vLLM's image), imported
only for the source in use. It never runs inside the operator.

    python3 prefetch.py --dest /model-cache/ORG--NAME hf --repo ORG/NAME
    python3 prefetch.py --dest /model-cache/ORG--NAME s3 --uri s3://BUCKET/PREFIX
    python3 prefetch.py --dest DIR --wait          # until DIR's marker exists (engines)

A finished fetch leaves DIR/.poolpilot-complete holding the source it came from; a fetch of the
same source finds it and exits at once, a crashed one resumes (files already complete, by size,
are kept). Errors end with one line saying what failed (the pod's termination message).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MARKER = ".poolpilot-complete"
# Weights vLLM does not load when safetensors are there (Llama repos carry original/*.pth,
# doubling the download).
SKIPPED_WITH_SAFETENSORS = ("*.pth", "*.pt", "*.bin", "original/*")


def complete(dest: Path, source: str) -> bool:
    marker = dest / MARKER
    try:
        return bool(json.loads(marker.read_text()).get("source") == source)
    except (OSError, ValueError):
        return False


def mark_complete(dest: Path, source: str, files: int, size: int) -> None:
    tmp = dest / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"source": source, "files": files, "bytes": size}) + "\n")
    tmp.replace(dest / MARKER)  # atomic: a reader sees no marker or the whole one


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def fetch_hf(repo: str, dest: Path, revision: str | None = None) -> tuple[int, int]:
    from huggingface_hub import HfApi, snapshot_download  # vLLM's image has it

    files = HfApi().list_repo_files(repo, revision=revision)
    ignore = list(SKIPPED_WITH_SAFETENSORS) if any(f.endswith(".safetensors")
                                                   for f in files) else ["original/*"]
    print(f"prefetch: {repo}: {len(files)} files in the repository, skipping {ignore}",
          flush=True)
    snapshot_download(repo, revision=revision, local_dir=str(dest), ignore_patterns=ignore)
    kept = [p for p in dest.rglob("*") if p.is_file() and ".cache" not in p.parts]
    return len(kept), sum(p.stat().st_size for p in kept)


def split_s3(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix -> ("bucket", "some/prefix/"); the bucket root -> ("bucket", "")."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri}: not an s3:// URI")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/") if prefix else ""


def fetch_s3(uri: str, dest: Path, client: Any = None) -> tuple[int, int]:
    """Copy every object under the prefix (boto3 reads AWS_* and AWS_ENDPOINT_URL itself)."""
    if client is None:
        import boto3  # vLLM's image has it

        client = boto3.client("s3")
    bucket, prefix = split_s3(uri)
    objects = [(o["Key"], int(o["Size"]))
               for page in client.get_paginator("list_objects_v2").paginate(
                   Bucket=bucket, Prefix=prefix)
               for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    if not objects:
        raise RuntimeError(f"{uri}: no objects under this prefix (check the URI and the "
                           "credentials' list permission)")
    total = sum(size for _, size in objects)
    done = 0
    for i, (key, size) in enumerate(objects, 1):
        target = dest / key[len(prefix):]
        if not (target.is_file() and target.stat().st_size == size):
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(target.name + ".part")
            client.download_file(bucket, key, str(part))
            part.replace(target)
        done += size
        print(f"prefetch: {i}/{len(objects)} files, {_gb(done)} of {_gb(total)}", flush=True)
    return len(objects), total


def wait(dest: Path, period: float, say: Callable[[str], None] = print,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> None:
    """Until the marker exists (the prefetcher on this node finished)."""
    start = clock()
    while not (dest / MARKER).is_file():
        say(f"prefetch: waiting for {dest} ({clock() - start:.0f} s)")
        sleep(period)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, required=True, help="the model's folder")
    parser.add_argument("--wait", action="store_true", help="wait for the marker, fetch nothing")
    parser.add_argument("--wait-period", type=float, default=5.0)
    parser.add_argument("--then-sleep", action="store_true",
                        help="stay up after the fetch (a DaemonSet's pod), ready once done")
    sub = parser.add_subparsers(dest="source")
    hf = sub.add_parser("hf", help="from the Hugging Face Hub (HF_TOKEN for gated models)")
    hf.add_argument("--repo", required=True)
    hf.add_argument("--revision")
    s3 = sub.add_parser("s3", help="from an S3-compatible bucket (AWS_* variables)")
    s3.add_argument("--uri", required=True)
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.wait:
        wait(args.dest, args.wait_period)
        return 0
    if args.source is None:
        parser.error("give a source: hf or s3")
    source = f"hf:{args.repo}@{args.revision or 'main'}" if args.source == "hf" else args.uri
    if complete(args.dest, source):
        print(f"prefetch: {args.dest} already holds {source}", flush=True)
    else:
        args.dest.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        try:
            files, size = (fetch_hf(args.repo, args.dest, args.revision) if args.source == "hf"
                           else fetch_s3(args.uri, args.dest))
        except Exception as exc:  # the last line is the pod's termination message
            why = " ".join(str(exc).split())  # the Hub's errors run over several lines
            print(f"prefetch of {source} failed: {type(exc).__name__}: {why}", file=sys.stderr,
                  flush=True)
            return 1
        mark_complete(args.dest, source, files, size)
        took = time.monotonic() - start
        print(f"prefetch: {source}: {files} files, {_gb(size)} in {took:.0f} s", flush=True)
    if args.then_sleep:
        while True:  # the DaemonSet's pod stays, its readiness is the marker
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
