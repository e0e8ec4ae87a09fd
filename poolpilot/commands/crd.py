"""`poolpilot crd [--check] [--write]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from poolpilot import crd


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true", help="exit 1 with a diff if FILE drifted")
    p.add_argument("--write", action="store_true", help="regenerate FILE")
    p.add_argument("--file", type=Path, default=crd.CRD_PATH, help="committed CRD (%(default)s)")


def run(args: argparse.Namespace) -> int:
    if args.check:
        diff = crd.drift(args.file)
        if diff:
            sys.stdout.write(diff)
            print(f"\n{args.file} is out of date; run: poolpilot crd --write", file=sys.stderr)
            return 1
        print(f"{args.file} matches the models")
        return 0
    if args.write:
        args.file.parent.mkdir(parents=True, exist_ok=True)
        args.file.write_text(crd.render_crd())
        print(f"wrote {args.file}")
        return 0
    sys.stdout.write(crd.render_crd())
    return 0
