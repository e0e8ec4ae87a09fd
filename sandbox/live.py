"""Watching the sandbox live: links into Prometheus's own graph page, one per key panel of the
Grafana dashboards, with the panels' PromQL taken from the dashboard generator (not written a
second time) and Grafana's variables filled in for one pool.

No Grafana server can run here, but the sandbox's Prometheus serves its classic UI
(`/classic/graph`, every asset local): a link there draws the same query the dashboard panel
would. A panel with several queries (desired and ready replicas, TTFT p90 and its target)
becomes one expression whose series carry a `series` label naming the query, so they share one
graph as they share one panel in Grafana.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from poolpilot.dashboards import grafana

from poolpilot import metrics

GRAPH_PAGE = "/classic/graph"  # Debian's Prometheus 2.42 ships the classic UI only


@dataclass(frozen=True)
class KeyPanel:
    label: str  # what the link shows, in words
    dashboard: str  # a key of grafana.DASHBOARDS
    title: str  # the panel's title there
    queries: tuple[str, ...] = ()  # the panel's queries to draw, by legend suffix; () = all


KEY_PANELS = (
    KeyPanel("replicas desired vs ready per role", "pool", "Desired vs ready replicas per role"),
    KeyPanel("router TTFT p90 vs the SLO", "pool", "TTFT at the router (user-visible)",
             ("p90", "target")),
    KeyPanel("queue depth per role", "pool", "Queue depth per role"),
    KeyPanel("autoscaler decisions by reason", "autoscaler", "Decisions by reason"),
)


class PanelNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Link:
    label: str
    expr: str
    url: str


def panel_queries(dashboard: dict[str, Any], title: str,
                  wanted: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(name, PromQL) of a panel's queries; the name is the legend without its {{label}}
    placeholders ("{{pool}} {{role}} desired" -> "desired")."""
    panel = next((p for p in dashboard["panels"] if p.get("title") == title), None)
    if panel is None:
        raise PanelNotFound(f"dashboard {dashboard['uid']} has no panel {title!r}")
    out = []
    for target in panel["targets"]:
        name = re.sub(r"\{\{[^}]*\}\}", "", target["legendFormat"]).strip()
        if not wanted or name in wanted:
            out.append((name, target["expr"]))
    if wanted and [n for n, _ in out] != list(wanted):
        raise PanelNotFound(f"panel {title!r} has no queries named {wanted} (it has "
                            f"{[t['legendFormat'] for t in panel['targets']]})")
    return out


def regex_literal(value: str) -> str:
    """`value` matched literally by a PromQL regex matcher (=~"..."): regex metacharacters
    escaped, and each escaping backslash doubled for the PromQL string."""
    return "".join("\\\\" + c if c in ".+*?()[]{}|^$\\" else c for c in value)


def fill_variables(expr: str, namespace: str, pool: str, rate_window: str) -> str:
    """Grafana's template variables as Grafana would fill them for one pool."""
    filled = (expr.replace("$__rate_interval", rate_window)
              .replace("$namespace", regex_literal(namespace))
              .replace("$pool", regex_literal(pool)))
    if "$" in filled:
        raise ValueError(f"a Grafana variable the sandbox does not fill: {filled}")
    return filled


def one_graph(queries: list[tuple[str, str]]) -> str:
    """Several queries as one expression, each series labelled with its query's name."""
    if len(queries) == 1:
        return queries[0][1]
    return " or ".join(f'label_replace({expr}, "series", "{name}", "", "")'
                       for name, expr in queries)


def duration(seconds: float) -> str:
    """A Prometheus duration (whole milliseconds: 2.x accepts no fractions)."""
    return f"{max(1, round(seconds * 1000))}ms"


def graph_url(prometheus: str, exprs: list[str], range_s: float) -> str:
    """The classic graph page with one graph per expression, over the last `range_s`."""
    minutes = max(5, math.ceil(range_s / 60))
    params: dict[str, str] = {}
    for i, expr in enumerate(exprs):
        params |= {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.stacked": "0",
                   f"g{i}.range_input": f"{minutes}m"}
    return f"{prometheus}{GRAPH_PAGE}?{urlencode(params)}"


def panel_links(prometheus: str, namespace: str, pool: str, rate_window_s: float,
                range_s: float) -> list[Link]:
    """One link per key panel, for one pool. `rate_window_s` is in real seconds (the
    sandbox's rate window divided by --speed): what $__rate_interval stands for."""
    window = duration(rate_window_s)
    links = []
    for key in KEY_PANELS:
        dashboard = grafana.DASHBOARDS[key.dashboard]()
        queries = [(name, fill_variables(expr, namespace, pool, window))
                   for name, expr in panel_queries(dashboard, key.title, key.queries)]
        expr = one_graph(queries)
        links.append(Link(key.label, expr, graph_url(prometheus, [expr], range_s)))
    return links


PREFIX_HIT_RATE_LABEL = "engine prefix-cache hit rate per role"


def prefix_hit_rate_expr(selector: str, window: str, by: str = "namespace, pool, role") -> str:
    """Hit tokens over query tokens of the engines' prefix caches (vLLM's counters), per
    `by`, over each rate window: the share of prompt tokens the caches served."""
    def rate(metric: str) -> str:
        return f"sum by ({by}) (rate({metric}{{{selector}}}[{window}]))"
    return f"{rate(metrics.VLLM_PREFIX_CACHE_HITS)} / {rate(metrics.VLLM_PREFIX_CACHE_QUERIES)}"


def prefix_hit_rate_link(prometheus: str, namespace: str, pool: str, rate_window_s: float,
                         range_s: float) -> Link:
    """The graph link of the engines' prefix-cache hit rate, for one pool."""
    selector = (f'namespace=~"{regex_literal(namespace)}",pool=~"{regex_literal(pool)}"')
    expr = prefix_hit_rate_expr(selector, duration(rate_window_s))
    return Link(PREFIX_HIT_RATE_LABEL, expr, graph_url(prometheus, [expr], range_s))
