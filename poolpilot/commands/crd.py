"""`poolpilot crd [--check] [--write]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from poolpilot import crd


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true",
                   help="exit 1 with a diff if FILE drifted (2 if it is missing)")
    p.add_argument("--write", action="store_true", help="regenerate FILE")
    p.add_argument(
        "--file",
        type=Path,
        action="append",
        help=f"committed CRD file (default: {crd.CRD_PATH} and the chart's {crd.CHART_CRD_PATH})",
    )


def run(args: argparse.Namespace) -> int:
    files = args.file or [crd.CRD_PATH, crd.CHART_CRD_PATH]
    if args.check:
        missing = [f for f in files if not f.is_file()]
        for f in missing:
            print(f"poolpilot crd --check: {f}: no such file; run it in the repository's root "
                  "folder, or pass --file PATH", file=sys.stderr)
        if missing:
            return 2
        stale = [f for f in files if crd.drift(f)]
        for f in stale:
            sys.stdout.write(crd.drift(f))
            print(f"\n{f} is out of date; run: poolpilot crd --write", file=sys.stderr)
        for f in set(files) - set(stale):
            print(f"{f} matches the models")
        return 1 if stale else 0
    if args.write:
        for f in files:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(crd.render_crd())
            print(f"wrote {f}")
        return 0
    sys.stdout.write(crd.render_crd())
    return 0
