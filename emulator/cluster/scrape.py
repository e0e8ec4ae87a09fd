"""Prometheus scrape targets for the sandbox: every running pod with `prometheus.io/scrape`
annotations becomes a file_sd target with its namespace, pool, role and pod labels
(pods.scrape_target), as the chart's PodMonitor relabels them. Draining pods are scraped
until their process ends, as Prometheus would."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from . import pods as P


class ScrapeTargets:
    def __init__(self, on_change: Callable[[list[P.ScrapeTarget]], None]) -> None:
        self.on_change = on_change
        self._last = ""

    def sync(self, running: Sequence[P.PodView]) -> None:
        """`running`: views of the pods whose process is alive."""
        targets = [t for t in map(P.scrape_target, running) if t is not None]
        text = json.dumps([(t.address, t.labels) for t in targets], sort_keys=True)
        if text != self._last:
            self.on_change(targets)
            self._last = text
