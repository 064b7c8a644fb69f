"""deploy/grafana/sie-overview.json and deploy/prometheus/sie-alerts.yaml (deploy/README.md)
query only series SIE exports: every ``sie_*`` name in a panel, a template variable or an
alert is derived from ``sie.telemetry.Metrics``' registry, so renaming a series without
updating them fails here. Structure is checked too; ``promtool``, when on PATH, parses
every expression and runs a few alerts on synthetic series."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from ruamel.yaml import YAML

from sie.telemetry import LANE_LABELS, LaneGauges, Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "sie-overview.json"
ALERTS = ROOT / "deploy" / "prometheus" / "sie-alerts.yaml"
README = ROOT / "deploy" / "README.md"

#: Non-SIE series an expression may use.
FOREIGN_SERIES_ALLOWED = {"up"}

#: The series names a family of each type exposes (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}
#: Series whose value only grows: what rate(), irate() and increase() may take.
MONOTONIC_SUFFIXES = ("_total", "_bucket", "_count", "_sum")

AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile",
}  # fmt: skip
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp",
    "floor", "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_sum",
    "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace",
    "ln", "log2", "log10", "minute", "month", "predict_linear", "rate", "resets", "round",
    "scalar", "sgn", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector", "year",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
    "present_over_time",
}  # fmt: skip
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "atan2", "inf", "nan",
}  # fmt: skip
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.$:])([A-Za-z_:][\w:]*)(\s*\()?")
_SIE_NAME = re.compile(r"(?<![\w$])sie_[a-z0-9_]+")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$")


# ------------------------------------------------------------------ what SIE exports


def series_of(registry: CollectorRegistry) -> dict[str, str]:
    """Every series name the registry's families expose, with its family's type, derived
    from the type so that a labelled family with no sample yet still counts."""
    out: dict[str, str] = {}
    for family in registry.collect():
        assert family.type in SUFFIXES, f"{family.name}: unhandled type {family.type}"
        for suffix in SUFFIXES[family.type]:
            out[family.name + suffix] = family.type
    return out


EXPORTED = series_of(Metrics().registry)


def test_series_derivation_matches_prometheus_client() -> None:
    """The suffix table is what prometheus_client really emits (unlabelled metrics sample
    at once), including a Counter declared with and without ``_total``."""
    registry = CollectorRegistry()
    Counter("a_total", "a", registry=registry)
    Counter("b", "b", registry=registry)
    Gauge("c", "c", registry=registry)
    Histogram("d_seconds", "d", registry=registry)
    Summary("e", "e", registry=registry)
    sampled = {s.name for family in registry.collect() for s in family.samples}
    derived = set(series_of(registry))
    # _created is left out when PROMETHEUS_DISABLE_CREATED_SERIES is set, and this client's
    # summaries have no quantile series ("e"); nothing else may differ
    assert sampled <= derived
    assert derived - sampled <= {"a_created", "b_created", "d_seconds_created", "e_created", "e"}
    assert {"a_total", "b_total", "d_seconds_bucket", "d_seconds_sum"} <= sampled


def test_exported_series_include_every_family() -> None:
    lane_gauges = {family.name for family in LaneGauges().collect()}  # computed at scrape
    assert "sie_gateway_pending_demand" in lane_gauges and lane_gauges <= EXPORTED.keys()
    assert {
        "sie_requests_total",  # declared with _total
        "sie_gateway_rejected_requests_total",  # declared without
        "sie_request_duration_seconds_bucket",
        "sie_gateway_lane_queue_depth",
    } <= EXPORTED.keys()
    assert "sie_requests" not in EXPORTED and "sie_requests_total_total" not in EXPORTED
    assert LANE_LABELS == ("pool", "machine_profile", "bundle")  # the dashboard's variables


# ------------------------------------------------------------------ reading PromQL


def identifiers(expr: str) -> Iterator[tuple[str, bool]]:
    """Identifiers outside strings, label matchers, ranges and label lists, each with
    whether it is called (followed by ``(``)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(r"\1", text)
    for m in _IDENT.finditer(text):
        yield m.group(1), m.group(2) is not None


def call_arguments(expr: str, function: str) -> Iterator[str]:
    """The text inside each ``function(...)`` of the expression."""
    for m in re.finditer(rf"\b{function}\s*\(", expr):
        depth, start = 1, m.end()
        for i in range(start, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            if depth == 0:
                yield expr[start:i]
                break
        else:
            raise AssertionError(f"unbalanced parentheses after {function}: {expr!r}")


def problems(expr: str, exported: dict[str, str] = EXPORTED) -> list[str]:
    """Why ``expr`` is not a query on SIE's series; empty when it is."""
    out: list[str] = []
    if expr.count("(") != expr.count(")") or expr.count("{") != expr.count("}"):
        out.append("unbalanced brackets")
    # strict: any sie_ name anywhere, even in a string, must be a real series
    sie_names = set(_SIE_NAME.findall(expr))
    out += [f"{n} is not a series SIE exports" for n in sorted(sie_names - exported.keys())]
    if not sie_names:
        out.append("references no SIE series")
    for name, called in identifiers(expr):
        if name in KEYWORDS | AGGREGATIONS:
            continue
        if called:
            if name not in FUNCTIONS:
                out.append(f"{name}() is not a PromQL function")
        elif not name.startswith("sie_") and name not in FOREIGN_SERIES_ALLOWED:
            out.append(f"{name} is not an SIE series (nor allowed)")
    for arg in call_arguments(expr, "histogram_quantile"):
        out += [
            f"histogram_quantile over {n}, not a _bucket series"
            for n in _SIE_NAME.findall(arg)
            if not n.endswith("_bucket")
        ]
    for function in ("rate", "irate", "increase"):
        for arg in call_arguments(expr, function):
            out += [
                f"{function}() over {n}, which is not a counter"
                for n in _SIE_NAME.findall(arg)
                if not n.endswith(MONOTONIC_SUFFIXES) or exported.get(n) == "gauge"
            ]
    return out


def test_the_checker_catches_renames_and_strays() -> None:
    ok = (
        'histogram_quantile(0.99, sum by (le, endpoint) (rate(sie_request_duration_seconds_bucket{model=~"$model"}[$__rate_interval])))'
        " / on (endpoint) group_left sum(up offset 5m) and time() - sie_config_epoch > bool 0"
    )
    assert problems(ok) == []
    renamed = {k: v for k, v in EXPORTED.items() if k != "sie_request_duration_seconds_bucket"}
    assert problems(ok, renamed) == [
        "sie_request_duration_seconds_bucket is not a series SIE exports"
    ]
    assert problems("sum(rate(sie_requests[5m]))") == [  # the family name, not its series
        "sie_requests is not a series SIE exports",
        "rate() over sie_requests, which is not a counter",
    ]
    assert problems("sum(rate(node_cpu_seconds_total[5m])) + sie_config_epoch") == [
        "node_cpu_seconds_total is not an SIE series (nor allowed)"
    ]
    assert problems("hitogram_quantile(0.9, sie_batch_size_bucket)") == [
        "hitogram_quantile() is not a PromQL function"
    ]
    assert problems("histogram_quantile(0.9, rate(sie_batch_size_sum[5m]))") == [
        "histogram_quantile over sie_batch_size_sum, not a _bucket series"
    ]
    assert problems("rate(sie_gateway_lane_queue_depth[5m])") == [
        "rate() over sie_gateway_lane_queue_depth, which is not a counter"
    ]
    assert problems("vector(1)") == ["references no SIE series"]


# ------------------------------------------------------------------ the dashboard


def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))  # a collapsed row holds its panels


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expr) for every target and every query variable's selector."""
    dashboard = load_dashboard()
    out = [
        (f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
        for p in all_panels(dashboard["panels"])
        for t in p.get("targets", [])
    ]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = _LABEL_VALUES.match(query)
            assert m, f"variable {var['name']}: {query!r} is not label_values(selector, label)"
            out.append((f"variable {var['name']}", m["selector"]))
    return out


def test_dashboard_is_pretty_printed_json_with_the_sie_variables() -> None:
    text = DASHBOARD.read_text()
    dashboard = json.loads(text)
    assert text == json.dumps(dashboard, indent=2) + "\n"  # 2-space, stable diffs
    assert dashboard["uid"] == "sie-overview" and dashboard["title"]
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("pool", "machine_profile", "bundle", "model"):
        var = variables[name]
        assert var["type"] == "query" and var["datasource"]["uid"] == "${datasource}"
        m = _LABEL_VALUES.match(var["definition"])
        assert m and m["label"] == name, var["definition"]


def test_panels_have_unique_ids_targets_and_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    panels = list(all_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 30
    for p in graphs:
        where = f"panel {p['id']} {p.get('title')!r}"
        assert p.get("title") and p.get("description"), where
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        pos = p["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] + pos["w"] <= 24, where
        targets = p.get("targets", [])
        assert targets, f"{where} has no target"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), where
        for t in targets:
            assert t["datasource"]["uid"] == "${datasource}", where
            assert t.get("expr", "").strip(), f"{where} {t['refId']} has no expr"


def test_dashboard_queries_only_series_sie_exports() -> None:
    bad = {where: p for where, expr in dashboard_exprs() if (p := problems(expr))}
    assert bad == {}


def test_dashboard_variables_used_are_defined() -> None:
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_BUILTINS
    used = {a or b for _, expr in dashboard_exprs() for a, b in _VARIABLE.findall(expr)}
    assert used - defined == set()
    assert {"pool", "machine_profile", "bundle", "model", "__rate_interval"} <= used


def test_dashboard_covers_the_issue_series() -> None:
    """The panels the dashboard exists for (issue 15): removing one fails here."""
    used = {n for _, expr in dashboard_exprs() for n in _SIE_NAME.findall(expr)}
    assert {
        "sie_requests_total",
        "sie_request_duration_seconds_bucket",
        "sie_gateway_lane_queue_depth",
        "sie_gateway_lane_queue_snapshot_timestamp_seconds",
        "sie_gateway_pending_demand",
        "sie_gateway_rejected_requests_total",
        "sie_gateway_pool_warm_floor",
        "sie_gateway_pool_active_lease_gpus",
        "sie_gateway_pool_pinned_model_loaded",
        "sie_batch_inference_duration_seconds_sum",
        "sie_batch_size_bucket",
        "sie_worker_items_total",
        "sie_generation_time_to_first_token_seconds_bucket",
        "sie_generation_inter_token_latency_seconds_bucket",
        "sie_generation_generated_tokens_total",
        "sie_admission_parked_total",
        "sie_admission_rejected_total",
        "sie_engine_state_stale_total",
        "sie_config_epoch",
        "sie_gateway_config_bootstrap_degraded",
        "sie_gateway_queue_result_chunk_reserved_bytes",
        "sie_gateway_queue_result_chunk_rejections_total",
    } <= used


# ------------------------------------------------------------------ the alert rules


def load_alerts() -> dict[str, Any]:
    data = YAML(typ="safe", pure=True).load(ALERTS.read_text())
    assert isinstance(data, dict)
    return data


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_alerts()["groups"] for r in g["rules"]]


def test_alert_rules_structure() -> None:
    data = load_alerts()
    assert set(data) == {"groups"} and data["groups"]
    names = [g["name"] for g in data["groups"]]
    assert len(names) == len(set(names))
    for group in data["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"} and group["rules"]
    rules = alert_rules()
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts)), "duplicate alert names"
    for rule in rules:
        where = rule.get("alert")
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, where
        assert re.fullmatch(r"SIE[A-Za-z0-9]+", rule["alert"]), where
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), where
        assert re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", str(rule["for"])), where
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, where
        for key in ("summary", "description"):
            value = rule["annotations"].get(key)
            assert isinstance(value, str) and value.strip(), f"{where}: no {key}"


def test_alerts_query_only_series_sie_exports() -> None:
    bad = {r["alert"]: p for r in alert_rules() if (p := problems(r["expr"]))}
    assert bad == {}


def test_alerts_cover_the_issue_cases() -> None:
    by_series = " ".join(r["expr"] for r in alert_rules())
    for series in (
        "sie_requests_total",
        "sie_request_duration_seconds_bucket",
        "sie_gateway_lane_queue_depth",
        "sie_gateway_pending_demand",
        "sie_gateway_lane_queue_snapshot_timestamp_seconds",
        "sie_gateway_config_bootstrap_degraded",
        "sie_admission_rejected_total",
        "sie_engine_state_stale_total",
        "sie_worker_items_total",
        "sie_gateway_queue_result_chunk_rejections_total",
    ):
        assert re.search(rf"\b{series}\b", by_series), f"no alert on {series}"


def test_readme_names_both_files_and_links_the_docs() -> None:
    readme = README.read_text()
    for name in ("grafana/sie-overview.json", "prometheus/sie-alerts.yaml", "PrometheusRule"):
        assert name in readme
    assert "../docs/observability.md" in readme
    assert (README.parent / "../docs/observability.md").resolve().is_file()


# ------------------------------------------------------------------ promtool, when present

#: ``make test`` unpacks it there (Makefile); elsewhere one on PATH is used
_LOCAL_PROMTOOL = Path(__file__).resolve().parents[2] / ".cache" / "bin" / "promtool"
PROMTOOL = str(_LOCAL_PROMTOOL) if _LOCAL_PROMTOOL.exists() else shutil.which("promtool")
# `make test` always provides it; a bare `pytest` run without it skips these three
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing: make promtool")


def promtool(*args: str) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    promtool("check", "rules", str(ALERTS))


@needs_promtool
def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    def concrete(expr: str) -> str:  # Grafana's variables as Prometheus would see them
        return (
            expr.replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$__range", "1h")
        )

    rules = [
        {"record": f"sie_dashboard:expr_{i}", "expr": re.sub(r"\$\w+", ".*", concrete(e))}
        for i, (_, e) in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool("check", "rules", str(path))


@needs_promtool
def test_promtool_alerts_fire_on_synthetic_series(tmp_path: Path) -> None:
    """A lane never refreshed, with work queued and demand refused, and a gateway whose
    config bootstrap is degraded raise their alerts; a quiet engine raises none."""
    rules = load_alerts()
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        del rule["annotations"]  # promtool compares annotations too: labels are the point
    (tmp_path / "rules.yaml").write_text(json.dumps(rules))
    lane = {"pool": "default", "machine_profile": "l4", "bundle": "default"}
    selector = ",".join(f'{k}="{v}"' for k, v in lane.items())
    gateway = {"role": "gateway", "instance": "g1"}

    def series(name: str, values: str, labels: str = selector) -> dict[str, str]:
        return {"series": f"{name}{{{labels}}}", "values": values}

    def fired(alert: str, at: str, severity: str, **labels: str) -> dict[str, Any]:
        expected = [{"exp_labels": {"severity": severity, **labels}}] if severity else []
        return {"eval_time": at, "alertname": alert, "exp_alerts": expected}

    unit = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("sie_gateway_lane_queue_snapshot_timestamp_seconds", "0x30"),
                    series("sie_gateway_lane_queue_depth", "12x30"),
                    series("sie_gateway_pending_demand", "3x30"),
                    series(
                        "sie_gateway_config_bootstrap_degraded",
                        "1x30",
                        'role="gateway",instance="g1"',
                    ),
                ],
                "alert_rule_test": [
                    fired("SIELaneQueueSnapshotStale", "5m", "warning", **lane),
                    fired("SIELaneBacklogNotDraining", "25m", "critical", **lane),
                    fired("SIELanePendingDemandUnserved", "25m", "critical", **lane),
                    fired("SIEConfigBootstrapDegraded", "5m", "critical", **gateway),
                    fired("SIEAdmissionRejecting", "5m", ""),
                ],
            }
        ],
    }
    path = tmp_path / "alerts-test.yaml"
    path.write_text(json.dumps(unit))
    promtool("test", "rules", str(path))
