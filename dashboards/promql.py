"""PromQL building blocks shared by the dashboards and the rules.

vLLM's metric names contain a colon (`vllm:num_requests_waiting`). Prometheus 2.x scraping a
current prometheus_client negotiates OpenMetrics without UTF-8 names and stores them escaped
(`vllm_num_requests_waiting`); Prometheus 3 keeps the colon. Older vLLM releases used other
names for some signals (poolpilot.metrics.VLLM_RENAMED). `series()` matches all of those, so
a panel shows data whichever Prometheus and vLLM version a cluster runs.
"""

from __future__ import annotations

import re

from poolpilot import metrics as m

BY_ROLE = "namespace, pool, role"
BY_POOL = "namespace, pool"

# Engine roles (everything the operator labels with a role but the router).
ENGINE_ROLES = 'role=~"prefill|decode|engine"'
# Targets the operator labels (engines and routers); `up` is Prometheus's own series per target.
POOL_TARGETS = 'pool!=""'


def series(metric: str, *matchers: str) -> str:
    """A series selector: `name{matchers}`, or for vLLM names a `__name__` regex over all the
    names the metric may have in Prometheus."""
    parts = [x for x in matchers if x]
    if metric.startswith("vllm:"):
        alternatives = "|".join(re.escape(n.removeprefix("vllm:")) for n in m.vllm_names(metric))
        alternatives = alternatives.replace("\\", "\\\\")  # PromQL string escaping
        group = f"({alternatives})" if "|" in alternatives else alternatives
        return "{" + ", ".join([f'__name__=~"vllm[:_]{group}"', *parts]) + "}"
    return metric + ("{" + ", ".join(parts) + "}" if parts else "")


def rate(metric: str, window: str, *matchers: str) -> str:
    return f"rate({series(metric, *matchers)}[{window}])"


def quantile(q: float | str, histogram: str, window: str, by: str, *matchers: str) -> str:
    """histogram_quantile over a classic histogram, aggregated by `by` (le is kept)."""
    buckets = rate(histogram + "_bucket", window, *matchers)
    return f"histogram_quantile({q}, sum by ({by}, le) ({buckets}))"


def share_within(histogram: str, le: str, window: str, by: str, *matchers: str) -> str:
    """Fraction of observations at or below the bucket bound `le`.

    `le` is matched as `X` or `X.0`: Go clients print 1 as "1", Python clients as "1.0".
    """
    le_matcher = 'le=~"' + le + r'(\\.0)?"'  # PromQL string: backslash-escaped dot
    good = f"sum by ({by}) ({rate(histogram + '_bucket', window, *matchers, le_matcher)})"
    total = f"sum by ({by}) ({rate(histogram + '_count', window, *matchers)})"
    return f"{good} / {total}"
