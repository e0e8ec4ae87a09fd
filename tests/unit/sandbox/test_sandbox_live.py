"""The sandbox's live links: the key dashboard panels' PromQL, filled in for one pool, as
links into Prometheus's classic graph page; and the env default of --duration."""

from __future__ import annotations

import argparse
from urllib.parse import parse_qs, urlsplit

import pytest
from poolpilot.dashboards import grafana
from poolpilot.sandbox import live
from poolpilot.sandbox import main as sandbox_main

PROM = "http://127.0.0.1:9090"


def test_one_link_per_key_panel_with_the_dashboards_own_queries() -> None:
    links = live.panel_links(PROM, "sandbox", "demo", rate_window_s=7.5, range_s=130)
    assert [link.label for link in links] == [
        "replicas desired vs ready per role", "router TTFT p90 vs the SLO",
        "queue depth per role", "autoscaler decisions by reason"]
    for key, link in zip(live.KEY_PANELS, links, strict=True):
        panel = next(p for p in grafana.DASHBOARDS[key.dashboard]()["panels"]
                     if p.get("title") == key.title)
        drawn = [t["expr"] for t in panel["targets"]
                 if not key.queries or t["legendFormat"].endswith(key.queries)]
        assert len(drawn) == (len(key.queries) or len(panel["targets"]))
        for expr in drawn:  # the generator's PromQL, variables filled in as Grafana would
            filled = (expr.replace("$__rate_interval", "7500ms")
                      .replace("$namespace", "sandbox").replace("$pool", "demo"))
            assert filled in link.expr
        assert "$" not in link.expr


def test_several_queries_share_one_graph_each_series_named() -> None:
    link = live.panel_links(PROM, "sandbox", "demo", 7.5, 130)[1]
    assert link.expr.startswith("label_replace(histogram_quantile(0.9, ")
    assert ', "series", "p90", "", "") or label_replace(max by (namespace, pool) (' in link.expr
    assert link.expr.endswith(', "series", "target", "", "")')


def test_the_url_opens_the_classic_graph_page_over_the_run() -> None:
    link = live.panel_links(PROM, "sandbox", "demo", 7.5, range_s=400)[2]
    url = urlsplit(link.url)
    assert f"{url.scheme}://{url.netloc}{url.path}" == f"{PROM}/classic/graph"
    query = parse_qs(url.query)
    assert query == {"g0.expr": [link.expr], "g0.tab": ["0"], "g0.stacked": ["0"],
                     "g0.range_input": ["7m"]}


@pytest.mark.parametrize(("namespace", "pool", "matcher"), [
    ("sandbox", "demo", 'namespace=~"sandbox", pool=~"demo"'),
    ("team-a", "llama-8b", 'namespace=~"team-a", pool=~"llama-8b"'),
    ("ns", "v1.2", r'namespace=~"ns", pool=~"v1\\.2"'),  # a literal dot, PromQL-escaped
], ids=["plain", "dashes", "dot"])
def test_names_are_matched_literally(namespace: str, pool: str, matcher: str) -> None:
    expr = live.fill_variables('up{namespace=~"$namespace", pool=~"$pool"}[$__rate_interval]',
                               namespace, pool, "5s")
    assert expr == "up{" + matcher + "}[5s]"


def test_an_unknown_variable_is_an_error_not_a_broken_link() -> None:
    with pytest.raises(ValueError, match=r"\$interval"):
        live.fill_variables("rate(x[$interval])", "ns", "p", "5s")


@pytest.mark.parametrize(("title", "queries", "error"), [
    ("No such panel", (), "has no panel 'No such panel'"),
    ("TTFT at the router (user-visible)", ("p95",), "has no queries named ('p95',)"),
], ids=["panel", "query"])
def test_a_renamed_panel_or_query_fails_loudly(title: str, queries: tuple[str, ...],
                                               error: str) -> None:
    with pytest.raises(live.PanelNotFound, match=error.replace("(", r"\(").replace(")", r"\)")):
        live.panel_queries(grafana.DASHBOARDS["pool"](), title, queries)


@pytest.mark.parametrize(("seconds", "text"), [(7.5, "7500ms"), (30, "30000ms"),
                                               (0.0001, "1ms")], ids=["fraction", "whole", "tiny"])
def test_durations_are_whole_milliseconds(seconds: float, text: str) -> None:
    assert live.duration(seconds) == text


def _duration_default(monkeypatch: pytest.MonkeyPatch, value: str | None) -> object:
    if value is None:
        monkeypatch.delenv(sandbox_main.DURATION_ENV, raising=False)
    else:
        monkeypatch.setenv(sandbox_main.DURATION_ENV, value)
    p = argparse.ArgumentParser()
    sandbox_main.add_arguments(p)
    return p.parse_args([]).duration


def test_duration_env_sets_the_default_and_a_flag_still_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _duration_default(monkeypatch, None) is None
    assert _duration_default(monkeypatch, "45") == 45.0
    p = argparse.ArgumentParser()
    sandbox_main.add_arguments(p)
    assert p.parse_args(["--duration", "10"]).duration == 10.0


@pytest.mark.parametrize("value", ["soon", "0", "-5"], ids=["text", "zero", "negative"])
def test_a_bad_duration_env_names_the_variable(monkeypatch: pytest.MonkeyPatch,
                                               value: str) -> None:
    with pytest.raises(SystemExit, match=f"POOLPILOT_SANDBOX_DURATION={value}: must be"):
        _duration_default(monkeypatch, value)
