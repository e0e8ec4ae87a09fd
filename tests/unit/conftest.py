"""The unit tier's shared set-up."""

from __future__ import annotations

import functools

import kubernetes_validate.utils

# kubernetes_validate reads and parses its JSON schemas (the definitions file is megabytes)
# on every validate() call; the manifests tests validate thousands of objects. The files do
# not change during a run, and the parsed schemas are only read, so each is parsed once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents)
# It also lists and sorts its schema folders twice per call (a fifth of a call's time); they
# are the installed package's, fixed for the run.
kubernetes_validate.utils.all_versions = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.all_versions)
