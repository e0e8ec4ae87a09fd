"""The autoscaler's PromQL: a fixed, small set of queries for ALL pools at once.

Every query aggregates `by (namespace, pool, role)` (the labels Prometheus relabels from the
pods), so one cycle costs the same handful of queries whether it watches 1 pool or 1,000.
Latency quantiles depend on the pools' SLOs, so there is one TTFT/ITL query per distinct
quantile in use (usually one: 0.9).

vLLM renames metrics between releases; each signal falls back to the older name per group
with PromQL `or` (a pool still on an old vLLM keeps working, one on a new vLLM wins):

| signal         | current name (vLLM 0.3x)             | older name                            |
|----------------|--------------------------------------|---------------------------------------|
| KV-cache usage | vllm:kv_cache_usage_perc             | vllm:gpu_cache_usage_perc             |
| ITL            | vllm:inter_token_latency_seconds     | vllm:time_per_output_token_seconds    |

(The table is poolpilot.metrics.VLLM_RENAMED; add a row there and every query follows.)

Every vLLM name is also tried in its underscore-escaped form (`vllm:num_requests_waiting` ->
`vllm_num_requests_waiting`): prometheus_client (0.2x) escapes the colon in sample names when
a scraper negotiates OpenMetrics 1.0 without asking for UTF-8 names, which Prometheus 2.x
does, so the same engine shows up under either name depending on the Prometheus version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from poolpilot import metrics as m

BY = "namespace, pool, role"

# Keys of the per-group values the observation reads.
WAITING = "waiting"
RUNNING = "running"
KV_USAGE = "kv_usage"
PROMPT_RATE = "prompt_tokens_rate"
GENERATION_RATE = "generation_tokens_rate"
SAMPLE_TIME = "sample_time"
ROUTER_INFLIGHT = "router_inflight"
ROUTER_REQUEST_RATE = "router_request_rate"
REQUEST_RATE = "request_rate"
LOCAL_PREFILL_RATE = "local_prefill_rate"
ROUTER_HELD_PREFILL = "router_held_prefill"
KV_FAILURE_RATE = "kv_failure_rate"
PREFIX_HIT_RATE = "prefix_hit_rate"
# Per-pod keys (QuerySet.pod_queries), for the choice of a scale-down's victims.
POD_IN_FLIGHT = "pod_in_flight"
POD_PREFIX_HITS = "pod_prefix_hits"
ENDPOINT_EXPECTED_HITS = "endpoint_expected_hits"
# The compile-cache gauge's place among a pod's cold-start phases (cold_start_query).
COMPILE_CACHE_PHASE = "compile_cache_hit"


def name_variants(metric: str) -> list[str]:
    """The names one vLLM signal may carry in Prometheus, preferred first."""
    out: list[str] = []
    for name in m.vllm_names(metric):
        out += [name] if ":" not in name else [name, name.replace(":", "_")]
    return out


def ttft_key(q: float) -> str:
    return f"ttft@{q:g}"


def itl_key(q: float) -> str:
    return f"itl@{q:g}"


def router_ttft_key(q: float) -> str:
    return f"router_ttft@{q:g}"


@dataclass(frozen=True)
class QuerySet:
    """Builds the queries for a scope (some namespaces or all) and a rate window."""

    window_seconds: float = 60.0
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    # Set (by a shard): only pools of these names, in whichever namespace. None: every pool.
    # A regex of literal alternatives, which Prometheus matches as a set lookup.
    pools: tuple[str, ...] | None = None

    def selector(self) -> str:
        matchers = ['pool!=""']
        if self.namespaces:
            matchers.append('namespace=~"' + "|".join(sorted(self.namespaces)) + '"')
        if self.pools is not None:
            # Names are DNS labels or subdomains: "." is the one character RE2 reads as more
            # than itself (escaped once for the regex, once for the PromQL string).
            names = "|".join(p.replace(".", "\\\\.") for p in sorted(self.pools))
            matchers.append(f'pool=~"{names}"' if names else 'pool=""')
        return "{" + ", ".join(matchers) + "}"

    def window(self) -> str:
        ms = max(1, round(self.window_seconds * 1000))
        return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"

    def _compat(self, metric: str, build: Callable[[str], str]) -> str:
        """`build(metric)`, falling back per group to the escaped name, then to the older
        vLLM name (and its escaped form) if there is one."""
        return " or ".join(build(name) for name in name_variants(metric))

    def bucket_rates(self, histogram: str) -> str:
        """Per-group bucket rates of an engine histogram: the input of its quantiles."""
        s, w = self.selector(), self.window()
        return self._compat(histogram, lambda h: f"sum by ({BY}, le) (rate({h}_bucket{s}[{w}]))")

    def router_bucket_rates(self) -> str:
        """Per-pool bucket rates of the router's TTFT histogram."""
        s, w = self.selector(), self.window()
        return f"sum by (namespace, pool, le) (rate({m.ROUTER_TTFT}_bucket{s}[{w}]))"

    def hit_rate(self) -> str:
        """Per-group prefix-cache hit rate: rate of hit tokens over rate of queried tokens,
        each name variant (the colon escaped or not) paired with its own. The hits loaded
        from a CPU offload tier (vLLM's external prefix-cache hits) count too, except at
        decode engines, whose external hits are the prompts the prefill engines sent them."""
        s, w = self.selector(), self.window()
        ext_s = s[:-1] + ', role!="decode"}'
        external = name_variants(m.VLLM_EXTERNAL_PREFIX_CACHE_HITS)

        def ratio(i: int, hits: str, queries: str) -> str:
            h = f"sum by ({BY}) (rate({hits}{s}[{w}]))"
            if i < len(external):  # the older names had no external counterpart
                h = f"({h} + (sum by ({BY}) (rate({external[i]}{ext_s}[{w}])) or 0 * {h}))"
            return f"({h} / sum by ({BY}) (rate({queries}{s}[{w}])))"

        pairs = zip(name_variants(m.VLLM_PREFIX_CACHE_HITS),
                    name_variants(m.VLLM_PREFIX_CACHE_QUERIES), strict=True)
        return " or ".join(ratio(i, h, qn) for i, (h, qn) in enumerate(pairs))

    def pod_queries(self, namespace: str, pool: str, role: str) -> dict[str, str]:
        """Per-pod series of one role (by `pod`; the router's by `endpoint`), asked only
        before a scale-down chooses its victims: requests in flight, prompt tokens/s served
        from each pod's prefix cache, and those the router expected each endpoint to hold."""
        sel = f'{{namespace="{namespace}", pool="{pool}", role="{role}"}}'
        w = self.window()
        return {
            POD_IN_FLIGHT: " + ".join(
                "(" + self._compat(g, lambda n: f"sum by (pod) ({n}{sel})") + ")"
                for g in (m.VLLM_RUNNING, m.VLLM_WAITING)),
            POD_PREFIX_HITS: self._compat(
                m.VLLM_PREFIX_CACHE_HITS, lambda c: f"sum by (pod) (rate({c}{sel}[{w}]))"),
            # (by pool only: the router pod's own `role` label is the router's; endpoints are
            # addresses, unique across roles)
            ENDPOINT_EXPECTED_HITS: (f"sum by (endpoint) (rate({m.ROUTER_PREFIX_EXPECTED_HITS}"
                                     f'{{namespace="{namespace}", pool="{pool}"}}[{w}]))'),
        }

    def cold_start_query(self, namespace: str, pool: str, role: str) -> str:
        """Per pod of one role: the phases of its engine's cold start (the launcher's series,
        by `pod` and `phase`) and its compile-cache gauge (as phase COMPILE_CACHE_PHASE).
        Asked only while a role has ready pods whose start is not measured yet."""
        sel = f'{{namespace="{namespace}", pool="{pool}", role="{role}"}}'
        return (f"max by (pod, phase) ({m.ENGINE_COLD_START}{sel}) or label_replace("
                f"max by (pod) ({m.ENGINE_COMPILE_CACHE_HIT}{sel}), "
                f'"phase", "{COMPILE_CACHE_PHASE}", "", "")')

    def _quantile(self, q: float, histogram: str) -> str:
        return f"histogram_quantile({q:g}, {self.bucket_rates(histogram)})"

    def build(
        self, ttft_quantiles: Iterable[float] = (0.9,), itl_quantiles: Iterable[float] = (0.9,)
    ) -> dict[str, str]:
        """Query key -> PromQL. Keys: the constants above plus ttft@Q, itl@Q, router_ttft@Q."""
        s, w = self.selector(), self.window()
        queries = {
            WAITING: self._compat(m.VLLM_WAITING, lambda g: f"sum by ({BY}) ({g}{s})"),
            RUNNING: self._compat(m.VLLM_RUNNING, lambda g: f"sum by ({BY}) ({g}{s})"),
            KV_USAGE: self._compat(m.VLLM_KV_USAGE, lambda g: f"avg by ({BY}) ({g}{s})"),
            PROMPT_RATE: self._compat(
                m.VLLM_PROMPT_TOKENS, lambda c: f"sum by ({BY}) (rate({c}{s}[{w}]))"
            ),
            GENERATION_RATE: self._compat(
                m.VLLM_GENERATION_TOKENS, lambda c: f"sum by ({BY}) (rate({c}{s}[{w}]))"
            ),
            # Newest sample per group: its age tells stale data from fresh.
            SAMPLE_TIME: self._compat(
                m.VLLM_WAITING, lambda g: f"max by ({BY}) (timestamp({g}{s}))"
            ),
            ROUTER_INFLIGHT: f"sum by (namespace, pool) ({m.ROUTER_INFLIGHT}{s})",
            ROUTER_REQUEST_RATE: f"sum by (namespace, pool) (rate({m.ROUTER_REQUESTS}{s}[{w}]))",
            # Requests each role's engines finished (at prefill: prompts prefilled), for the
            # mean prompt length.
            REQUEST_RATE: self._compat(
                m.VLLM_REQUEST_SUCCESS, lambda c: f"sum by ({BY}) (rate({c}{s}[{w}]))"
            ),
            # Prompt demand the prefill role did not see: requests the router prefilled on a
            # decode engine because prefill was behind (not the retries of failed handoffs,
            # which prefill had served).
            LOCAL_PREFILL_RATE: (
                f"sum by (namespace, pool) (rate({m.ROUTER_LOCAL_PREFILL}"
                f"{s[:-1]}, reason=\"{m.LOCAL_PREFILL_REASONS[0]}\"}}[{w}]))"
            ),
            # Prompts the router holds for a prefill engine (late binding): prefill requests
            # waiting, at the router instead of at an engine. (Its only role is prefill, and
            # in a cluster its `role` label is the router pod's: not selected on.)
            ROUTER_HELD_PREFILL: f"sum by (namespace, pool) ({m.ROUTER_HELD}{s})",
            # Share of prompt tokens the engines found in their prefix cache (token counters:
            # hits / queries over the window; NaN when nothing was looked up, no series when
            # the engines keep no such counters). The prefill model sizes for the rest.
            PREFIX_HIT_RATE: self.hit_rate(),
            KV_FAILURE_RATE: (
                f"sum by (namespace, pool) (rate({m.ROUTER_KV_TRANSFER_FAILURES}{s}[{w}]))"
            ),
        }
        for q in sorted(set(ttft_quantiles)):
            queries[ttft_key(q)] = self._quantile(q, m.VLLM_TTFT)
            queries[router_ttft_key(q)] = f"histogram_quantile({q:g}, {self.router_bucket_rates()})"
        for q in sorted(set(itl_quantiles)):
            queries[itl_key(q)] = self._quantile(q, m.VLLM_ITL)
        return queries
