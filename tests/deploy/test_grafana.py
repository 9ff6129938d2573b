"""deploy/grafana/kvtestbed.json: every metric its PromQL uses is one the service its job names exports."""
from __future__ import annotations

import json
import re

import yaml

from chat_frontend import metrics as frontend_metrics
from chat_frontend import vllm_metrics
from kvtb import metrics, steps
from kvtb.service_metrics import agent_families, compute_families, storage_families
from kvtb_proto import compute_pb2
from tests.deploy.conftest import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "kvtestbed.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
FRONTEND_JOB = "$frontend_job"  # the dashboard's variable: kvtb-frontend or kvtb-frontend-api
SELECTOR = re.compile(r"((?:vllm|kvtb):[A-Za-z0-9_:]+)(\{[^}]*\})?")


def sample_names(family) -> set[str]:
    """The names a family's samples have in the exposition (a counter's _total, a histogram's three)."""
    if family.type == "counter":
        return {family.name + "_total"}
    if family.type == "histogram":
        return {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return {family.name}


def histogram_names(*names: str) -> set[str]:
    return {metrics.PREFIX + name + suffix for name in names for suffix in ("_bucket", "_sum", "_count")}


def exported() -> dict[str, set[str]]:
    """Each scrape job's metric names, built from the services' own families (empty stats: every family)."""
    figures = {"turns_active": 0, "turns_waiting": 0, "rejected_busy": 0, "contexts": 0}
    replicas = {"up": {}, "turns": {}, "retries": 0}
    frontend = [*frontend_metrics.families(frontend_metrics.Tenants(), lambda: figures, lambda: replicas),
                *vllm_metrics.engine_families("m", compute_pb2.ComputeStatsResponse()),
                vllm_metrics.success_family("m", {}), *vllm_metrics.latency_families("m")]
    names = {
        "frontend": set().union(*map(sample_names, frontend)) | histogram_names(*frontend_metrics.HISTOGRAMS),
        "kvtb-smartnic": set().union(*map(sample_names, agent_families({}))) |
        histogram_names("trigger_to_fire_seconds"),
        "kvtb-compute": set().union(*map(sample_names, compute_families({}))),
        "kvtb-storage": set().union(*map(sample_names, storage_families({}, []))),
    }
    for job in ("kvtb-frontend", "kvtb-frontend-api", FRONTEND_JOB):
        names[job] = names["frontend"]
    return names


def panels() -> list[dict]:
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        out += [panel, *panel.get("panels", [])]
    return out


def test_every_metric_is_one_its_jobs_service_exports():
    names = exported()
    used = 0
    for panel in panels():
        for target in panel.get("targets", []):
            for metric, selector in SELECTOR.findall(target["expr"]):
                job = re.search(r'job=~?"([^"]+)"', selector or "")
                assert job, f"{panel['title']}: {metric} has no job selector: {target['expr']}"
                assert metric in names[job.group(1)], f"{panel['title']}: {job.group(1)} exports no {metric}"
                used += 1
    assert used > 40


def test_its_jobs_are_the_scrape_configs():
    jobs = {job["job_name"] for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == FRONTEND_JOB[1:]]
    assert set(variable["query"].split(",")) == {"kvtb-frontend", "kvtb-frontend-api"} <= jobs
    exprs = " ".join(t["expr"] for p in panels() for t in p.get("targets", []))
    assert set(re.findall(r'job=~?"([^"]+)"', exprs)) - {FRONTEND_JOB} <= jobs


def test_it_shows_the_eight_steps_and_vllms_request_panels():
    titles = [p["title"] for p in panels()]
    for step, name in steps.NAMES.items():
        assert f"{int(step)} {name}" in titles, name
    exprs = " ".join(t["expr"] for p in panels() for t in p.get("targets", []))
    for name in ("time_to_first_token_seconds_bucket", "e2e_request_latency_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "time_per_output_token_seconds_bucket",
                 "request_queue_time_seconds_bucket", "request_prompt_tokens_bucket",
                 "request_generation_tokens_bucket", "num_requests_running", "num_requests_waiting"):
        assert f"vllm:{name}" in exprs, name
    for name in ("kv_offload_bytes_total", "kv_restore_bytes_total", "triggered_ops_fired_total",
                 "trigger_to_fire_seconds_bucket", "fallbacks_total", "kv_evictions_total", "storage_bytes_used"):
        assert f"kvtb:{name}" in exprs, name
