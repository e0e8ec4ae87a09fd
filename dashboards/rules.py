"""Prometheus rules: recording rules per namespace/pool/role, the autoscaler's recording rules
and poolpilot's alerts.

The chart ships the groups with `@@name@@` placeholders (charts/poolpilot/files/
prometheus-rules.yaml) that its PrometheusRule template replaces with values
(`prometheusRule.*`, and `autoscaler.rateWindowSeconds` for the autoscaler's group);
`rule_groups(RuleParams())` gives the same groups with the chart's default values, which is
what `promtool` and the live-query test check. The autoscaler's group comes from
`poolpilot.autoscaler.recording` (the autoscaler checks it finds exactly those rules).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml
from poolpilot.autoscaler import recording
from poolpilot.dashboards.promql import (
    BY_POOL,
    BY_ROLE,
    POOL_TARGETS,
    quantile,
    rate,
    series,
    share_within,
)

from poolpilot import metrics as m

QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class RuleParams:
    """Values of the chart's `prometheusRule` block, as the strings Helm prints them."""

    rate_window: str = "2m"
    ttft_seconds: str = "1"
    itl_seconds: str = "0.05"
    objective: str = "0.9"
    fast_factor: str = "6"
    fast_short: str = "5m"
    fast_long: str = "1h"
    slow_factor: str = "2"
    slow_short: str = "30m"
    slow_long: str = "6h"
    not_ready_for: str = "10m"
    scaling_limited_for: str = "15m"
    metrics_missing_for: str = "5m"
    # The autoscaler's group: its --rate-window in whole seconds, and how often Prometheus
    # evaluates the group (each recorded value is up to that much older than a raw query's).
    autoscaler_window_seconds: str = "60"
    autoscaler_interval: str = "10s"
    runbook_base_url: str = "https://github.com/poolpilot/poolpilot/blob/main/docs/alerts.md"


# Placeholder name in the chart file -> values path under .Values.prometheusRule (under
# .Values for autoscaler.*).
VALUE_PATHS: dict[str, str] = {
    "rate_window": "rateWindow",
    "ttft_seconds": "slo.ttftSeconds",
    "itl_seconds": "slo.itlSeconds",
    "objective": "slo.objective",
    "fast_factor": "burn.fastFactor",
    "fast_short": "burn.fastShort",
    "fast_long": "burn.fastLong",
    "slow_factor": "burn.slowFactor",
    "slow_short": "burn.slowShort",
    "slow_long": "burn.slowLong",
    "not_ready_for": "notReadyFor",
    "scaling_limited_for": "scalingLimitedFor",
    "metrics_missing_for": "metricsMissingFor",
    "autoscaler_window_seconds": "autoscaler.rateWindowSeconds",
    "autoscaler_interval": "autoscalerRulesInterval",
    "runbook_base_url": "runbookBaseUrl",
}

# The group of alerts about the autoscaler's own series: only meaningful when Prometheus
# scrapes the autoscaler (the chart's ServiceMonitor), so the chart leaves it out otherwise.
AUTOSCALER_GROUP = "poolpilot.autoscaler.alerts"


def placeholders() -> RuleParams:
    """Params whose every value is its `@@valuesPath@@` placeholder (for the chart file)."""
    fields = dataclasses.fields(RuleParams)
    return RuleParams(**{f.name: f"@@{VALUE_PATHS[f.name]}@@" for f in fields})


def substitute(text: str, params: RuleParams) -> str:
    """What the chart's template does: replace each placeholder by its value."""
    for f in dataclasses.fields(RuleParams):
        text = text.replace(f"@@{VALUE_PATHS[f.name]}@@", getattr(params, f.name))
    return text


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    # Sub-expressions that must return series for the alert to be able to fire at all (the
    # live-query test runs each against a Prometheus scraping real exporters).
    inputs: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)

    def to_rule(self, runbook_base_url: str) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {"summary": self.summary, "description": self.description,
                            "runbook_url": runbook_url(runbook_base_url, self.name)},
        }


def runbook_url(base: str, alert: str) -> str:
    """The alert's section of docs/alerts.md (a heading named after the alert)."""
    return f"{base}#{alert.lower()}"


def recording_rules(p: RuleParams) -> list[dict[str, Any]]:
    """Latency quantiles, queue depth, load and token rates per namespace/pool/role."""
    w = p.rate_window
    rules: list[dict[str, Any]] = []
    # The router's histograms are the user-visible latency (role="router"); the engines' tell
    # which role adds it.
    latency = (
        ("poolpilot:router_ttft_seconds", m.ROUTER_TTFT),
        ("poolpilot:engine_ttft_seconds", m.VLLM_TTFT),
        ("poolpilot:router_itl_seconds", m.ROUTER_ITL),
        ("poolpilot:engine_itl_seconds", m.VLLM_ITL),
    )
    for record, hist in latency:
        for q in QUANTILES:
            rules.append({
                "record": record,
                "expr": quantile(q, hist, w, BY_ROLE),
                "labels": {"quantile": str(q)},
            })
    gauges = (
        ("poolpilot:queue_depth", "sum", m.VLLM_WAITING),
        ("poolpilot:running_requests", "sum", m.VLLM_RUNNING),
        ("poolpilot:kv_cache_usage:max", "max", m.VLLM_KV_USAGE),
    )
    for record, agg, metric in gauges:
        rules.append({"record": record, "expr": f"{agg} by ({BY_ROLE}) ({series(metric)})"})
    counters = (
        ("poolpilot:prompt_tokens:rate", m.VLLM_PROMPT_TOKENS),
        ("poolpilot:generation_tokens:rate", m.VLLM_GENERATION_TOKENS),
        ("poolpilot:router_requests:rate", m.ROUTER_REQUESTS),
    )
    for record, metric in counters:
        rules.append({"record": record, "expr": f"sum by ({BY_ROLE}) ({rate(metric, w)})"})
    rules.append({
        "record": "poolpilot:ready_replicas",
        "expr": f"sum by ({BY_ROLE}) ({series('up', POOL_TARGETS)})",
    })
    return rules


def _burn(histogram: str, target: str, window: str) -> str:
    """Error-budget burn rate at the router: share of requests slower than the target over
    the budget (1 - objective) is computed by the caller's threshold."""
    return f"(1 - ({share_within(histogram, target, window, BY_POOL)}))"


def _slo_alerts(p: RuleParams) -> list[Alert]:
    alerts = []
    slos = (("TTFT", m.ROUTER_TTFT, p.ttft_seconds, "time to first token", "requests"),
            ("ITL", m.ROUTER_ITL, p.itl_seconds, "inter-token latency", "tokens"))
    for short_name, hist, target, what, unit in slos:
        for speed, factor, short, long_, severity, for_ in (
            ("Fast", p.fast_factor, p.fast_short, p.fast_long, "critical", "2m"),
            ("Slow", p.slow_factor, p.slow_short, p.slow_long, "warning", "15m"),
        ):
            threshold = f"({factor} * (1 - {p.objective}))"
            short_burn, long_burn = _burn(hist, target, short), _burn(hist, target, long_)
            alerts.append(Alert(
                name=f"Poolpilot{short_name}BudgetBurn{speed}",
                expr=f"{short_burn} > {threshold}\nand\n{long_burn} > {threshold}",
                for_=for_,
                severity=severity,
                summary=f"{{{{ $labels.namespace }}}}/{{{{ $labels.pool }}}}: {what} SLO "
                        f"budget burning {speed.lower()}",
                description=(
                    f"More than {factor}x the error budget of the {what} SLO (objective "
                    f"{p.objective} of {unit} within {target}s at the router) is being "
                    f"spent over {short} and {long_}. Check the pool's queue depth per role "
                    "(Grafana: poolpilot / Pool) and whether the autoscaler is limited."
                ),
                inputs=(short_burn, long_burn),
            ))
    return alerts


def alerts(p: RuleParams) -> list[Alert]:
    up_by_role = f"sum by ({BY_ROLE}) ({series('up', POOL_TARGETS)})"
    desired = f"sum by ({BY_ROLE}) ({m.AUTOSCALER_DESIRED})"
    not_ready = (
        f"{up_by_role} == 0\nor\n"
        f"({desired} > 0 unless on ({BY_ROLE}) {up_by_role} > 0)"
    )
    limited = f"max by ({BY_ROLE}) ({m.AUTOSCALER_LIMITED})"
    metrics_available = f"min by ({BY_ROLE}) ({m.AUTOSCALER_METRICS_AVAILABLE})"
    kv_failures = (
        f"sum by ({BY_POOL}) ({rate(m.ROUTER_KV_TRANSFER_FAILURES, p.rate_window)})"
    )
    return [
        *_slo_alerts(p),
        Alert(
            name="PoolpilotPoolNotReady",
            expr=not_ready,
            for_=p.not_ready_for,
            severity="critical",
            summary="{{ $labels.namespace }}/{{ $labels.pool }}: no ready {{ $labels.role }} "
                    "replica",
            description=(
                "No {{ $labels.role }} pod of the pool is up (scraped) although the pool has "
                "or wants some. `kubectl describe inferencepool {{ $labels.pool }} -n "
                "{{ $labels.namespace }}` shows the Ready condition's reason."
            ),
            inputs=(up_by_role, desired),
        ),
        Alert(
            name="PoolpilotAutoscalerMetricsMissing",
            expr=f"{metrics_available} == 0",
            for_=p.metrics_missing_for,
            severity="warning",
            summary="{{ $labels.namespace }}/{{ $labels.pool }}: autoscaler holds "
                    "{{ $labels.role }} for lack of metrics",
            description=(
                "The autoscaler found no fresh value for a signal and holds the current size "
                "(MetricsAvailable=False). Check that Prometheus scrapes the pool's engines and "
                "router (PodMonitor/ServiceMonitor) and that the autoscaler's --prometheus URL "
                "is right."
            ),
            inputs=(metrics_available,),
        ),
        Alert(
            name="PoolpilotScalingLimited",
            expr=f"{limited} > 0",
            for_=p.scaling_limited_for,
            severity="warning",
            summary="{{ $labels.namespace }}/{{ $labels.pool }}: {{ $labels.role }} cannot "
                    "scale as needed",
            description=(
                "The autoscaler wants more {{ $labels.role }} replicas than can run (e.g. "
                "Unschedulable: no free GPUs, or maxReplicas reached). The pool's "
                "ScalingLimited condition names the reason."
            ),
            inputs=(limited,),
        ),
        Alert(
            name="PoolpilotKVTransferFailures",
            expr=f"{kv_failures} > 0",
            for_="5m",
            severity="warning",
            summary="{{ $labels.namespace }}/{{ $labels.pool }}: KV-cache transfers from "
                    "prefill to decode fail",
            description=(
                "The router sees KV-cache handoffs fail ({{ $value | humanize }}/s); requests "
                "are re-prefilled or fail. Check the KV connector (NIXL) logs of the decode "
                "pods and the network between prefill and decode."
            ),
            inputs=(kv_failures,),
        ),
    ]


def autoscaler_alerts(p: RuleParams) -> list[Alert]:
    """Alerts on the autoscaler's own series (AUTOSCALER_GROUP)."""
    leaders = f"sum by (shard) ({m.AUTOSCALER_LEADER})"  # per shard (autoscaler.shards)
    return [
        Alert(
            name="PoolpilotAutoscalerDown",
            expr=f"absent({m.AUTOSCALER_CYCLE}_count)",
            for_=p.metrics_missing_for,
            severity="warning",
            summary="poolpilot's autoscaler reports no cycles",
            description=(
                "Prometheus has no poolpilot_autoscaler_cycle_seconds series: the autoscaler is "
                "not running or not scraped (monitoring.serviceMonitor.enabled), so no pool is "
                "being resized."
            ),
            inputs=(f"{m.AUTOSCALER_CYCLE}_count",),
        ),
        Alert(
            name="PoolpilotAutoscalerNoLeader",
            expr=f"{leaders} == 0",
            for_=p.metrics_missing_for,
            severity="warning",
            summary="no poolpilot autoscaler replica of shard {{ $labels.shard }} holds "
                    "its leader lease",
            description=(
                "Every autoscaler replica of shard {{ $labels.shard }} runs but none acts: "
                "none could take the shard's Lease (its RBAC, or the API server), so the "
                "pools of that shard are not being resized. The replicas' logs say why."
            ),
            inputs=(leaders,),
        ),
    ]


def rule_groups(p: RuleParams, autoscaler_scraped: bool = True) -> dict[str, Any]:
    """The `spec` of the PrometheusRule (also a valid Prometheus rule file)."""
    base = p.runbook_base_url
    groups = [
        {"name": "poolpilot.recording", "rules": recording_rules(p)},
        recording.rule_group(f"{p.autoscaler_window_seconds}s", p.autoscaler_interval),
        {"name": "poolpilot.alerts", "rules": [a.to_rule(base) for a in alerts(p)]},
    ]
    if autoscaler_scraped:
        groups.append({"name": AUTOSCALER_GROUP,
                       "rules": [a.to_rule(base) for a in autoscaler_alerts(p)]})
    return {"groups": groups}


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line expressions, so the file reads like hand-written rules."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(groups: dict[str, Any]) -> str:
    return yaml.dump(groups, Dumper=_Dumper, sort_keys=False, width=100)
