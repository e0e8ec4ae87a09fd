"""PromQL building blocks shared by the dashboards and the rules."""

from __future__ import annotations

from poolpilot import metrics as m

BY_ROLE = "namespace, pool, role"
BY_POOL = "namespace, pool"

# Engine roles (everything the operator labels with a role but the router).
ENGINE_ROLES = 'role=~"prefill|decode|engine"'


def sel(*matchers: str) -> str:
    """A label selector body: `sel('role="decode"')` -> `{role="decode"}` (no braces if empty)."""
    parts = [x for x in matchers if x]
    return "{" + ", ".join(parts) + "}" if parts else ""


def rate(metric: str, selector: str, window: str) -> str:
    return f"rate({metric}{selector}[{window}])"


def quantile(q: float | str, histogram: str, selector: str, window: str, by: str) -> str:
    """histogram_quantile over a classic histogram, aggregated by `by` (le is kept)."""
    return (
        f"histogram_quantile({q}, sum by ({by}, le) "
        f"({rate(histogram + '_bucket', selector, window)}))"
    )


def share_within(histogram: str, le: str, selector: str, window: str, by: str) -> str:
    """Fraction of observations at or below the bucket bound `le`.

    `le` is matched as `X` or `X.0`: Go clients print 1 as "1", Python clients as "1.0".
    """
    le_matcher = 'le=~"' + le + r'(\\.0)?"'  # PromQL string: backslash-escaped dot
    good = f"sum by ({by}) ({rate(histogram + '_bucket', _add(selector, le_matcher), window)})"
    total = f"sum by ({by}) ({rate(histogram + '_count', selector, window)})"
    return f"{good} / {total}"


def _add(selector: str, matcher: str) -> str:
    if not selector:
        return "{" + matcher + "}"
    return selector[:-1] + ", " + matcher + "}"


# Targets the operator labels (engines and routers); `up` is Prometheus's own series per target.
POOL_TARGETS = 'pool!=""'

__all__ = ["BY_POOL", "BY_ROLE", "ENGINE_ROLES", "POOL_TARGETS", "m", "quantile", "rate",
           "sel", "share_within"]
