"""`poolpilot validate FILE...`: every error, one line each, exit 1 on any."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from poolpilot.validate import validate_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, metavar="FILE",
                   help="YAML files holding InferencePool manifests (globs: examples/*.yaml)")


def run(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        errors = validate_file(path)
        for line in errors:
            print(line, file=sys.stderr)
        if errors:
            failed = True
        else:
            print(f"{path}: valid")
    return 1 if failed else 0
