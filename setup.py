"""setuptools' package list, from pyproject.toml's package-dir (the rest of the metadata is there).

Each room is a top-level folder mapped into the `poolpilot` package. Listing every package under
each folder means a new sub-package cannot be left out of a wheel by a hand-kept list, and the
dev-only rooms ([tool.poolpilot] dev-only) are skipped when their folder is absent: the images
build without them.
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
package_dir: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
dev_only = set(pyproject["tool"]["poolpilot"]["dev-only"])

packages = []
for package, folder in package_dir.items():
    if folder in dev_only and not (ROOT / folder).is_dir():
        continue
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(str(ROOT / folder))]
setup(packages=sorted(set(packages)))
