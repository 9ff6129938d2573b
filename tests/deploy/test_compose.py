"""Integration tests across containers: the paper's workflow with faults injected into one
container at a time (`make compose-test`)."""
from __future__ import annotations

import json
import time

import pytest
import yaml

from kvtb import credentials
from tests.deploy.conftest import COMPOSE_FILE, TWO_REPLICAS

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

RECIPE = "Please give me a short recipe for cheesecake."
CELSIUS = "Only give temperatures in °C from now on."
OVEN = "What temperature should I set the oven to?"


@pytest.mark.compose
@pytest.mark.slow
def test_paper_conversation_through_the_client_container(deployment):
    result = deployment.compose("run", "--rm", "-T", "client", "chat", "--frontend", "frontend:50050",
                                "--script", "/src/deploy/demo-chat.txt", "--json", timeout=600)
    turns = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert turns[0]["kv_source"] == "none"
    for turn in turns[1:]:
        assert turn["kv_source"] == "restored", turn
        assert turn["bytes_restored"] > 0 and turn["tokens_reused"] > 0
        assert {5, 6, 7, 8} <= {s["step"] for s in turn["steps"]}


@pytest.mark.compose
@pytest.mark.slow
def test_killed_storage_node_falls_back_then_restores_after_restart(deployment):
    first = deployment.chat(RECIPE)[0]
    ctx = first["context_id"]
    # Both nodes hold chunks (rendezvous placement); killing either loses part of the context.
    for service in ("storage0", "storage1"):
        deployment.docker("kill", deployment.container(service))
    down = deployment.chat(CELSIUS, context=ctx)[0]
    assert down["kv_source"] == "recomputed" and down["fallback_reason"], down
    for service in ("storage0", "storage1"):
        deployment.docker("start", deployment.container(service))
        deployment.wait_healthy(service)
    time.sleep(3)  # the agent reconnects and re-reads what the nodes hold
    back = deployment.chat(OVEN, context=ctx)[0]
    assert back["kv_source"] == "restored", back
    assert back["tokens_reused"] > 0


@pytest.mark.compose
@pytest.mark.slow
def test_paused_storage_node_falls_back_within_a_bounded_time(deployment):
    ctx = deployment.chat(RECIPE)[0]["context_id"]
    containers = [deployment.container(s) for s in ("storage0", "storage1")]
    for cid in containers:
        deployment.docker("pause", cid)
    try:
        start = time.monotonic()
        paused = deployment.chat(CELSIUS, context=ctx, timeout=120)[0]
        elapsed = time.monotonic() - start
    finally:
        for cid in containers:
            deployment.docker("unpause", cid)
    assert paused["kv_source"] == "recomputed" and paused["fallback_reason"], paused
    assert elapsed < 60, f"the paused turn took {elapsed:.0f} s"
    time.sleep(2)
    again = deployment.chat(OVEN, context=ctx)[0]
    assert again["kv_source"] == "restored", again


@pytest.mark.compose
@pytest.mark.slow
def test_restarted_agent_rebuilds_its_hashmap(deployment):
    ctx = deployment.chat(RECIPE)[0]["context_id"]
    deployment.compose("restart", "smartnic")
    deployment.wait_healthy("smartnic")
    follow_up = deployment.chat(CELSIUS, context=ctx)[0]
    assert follow_up["kv_source"] == "restored", follow_up


@pytest.mark.compose
@pytest.mark.slow
def test_restarted_frontend_keeps_conversations(deployment):
    first = deployment.chat(RECIPE)[0]
    deployment.compose("restart", "frontend")
    deployment.wait_healthy("frontend")
    follow_up = deployment.chat(CELSIUS, context=first["context_id"])[0]
    assert follow_up["turn"] == 2
    assert follow_up["kv_source"] == "restored", follow_up


def test_stack_file_is_generated_from_the_compose_file():
    """The swarm form must not drift from the compose file it is derived from."""
    import subprocess
    import sys

    from tests.deploy.conftest import ROOT

    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "stack_file.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.compose
@pytest.mark.slow
def test_internal_ports_refuse_a_container_without_the_deployments_credentials(deployment):
    """A container on the deployment's network with the same image but not its credentials volume
    reaches none of the internal ports; with the volume, as the operator, it does."""
    import subprocess

    from tests.deploy.conftest import IMAGE

    def health(address: str, *volume: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "run", "--rm", "--network", f"{deployment.project}_default", *volume,
                               IMAGE, "health", address, "--timeout", "5"], capture_output=True, text=True,
                              timeout=120)

    mounted = ("-v", f"{deployment.project}_credentials:/credentials:ro", "-e", "KVTB_CREDENTIALS_DIR=/credentials")
    for address in ("smartnic:50051", "compute:50071", "storage0:50061"):
        stranger = health(address)
        assert stranger.returncode == 1 and "NOT SERVING" in stranger.stdout, (address, stranger.stdout)
        operator = health(address, *mounted)
        assert operator.returncode == 0 and "SERVING" in operator.stdout, (address, operator.stdout, operator.stderr)


# (job, instance, a series of that service) that Prometheus holds once it scraped every service: the
# frontend's vllm: and kvtb: series on its metrics port and on its API port (the scrape token), and a
# kvtb: series of the agent, the compute node and each storage node (deploy/prometheus/prometheus.yml)
SCRAPED = {
    ("kvtb-frontend", "frontend:9100", "vllm:e2e_request_latency_seconds_count"),
    ("kvtb-frontend", "frontend:9100", "vllm:request_queue_time_seconds_count"),
    ("kvtb-frontend", "frontend:9100", "kvtb:requests_total"),
    ("kvtb-frontend-api", "frontend:8000", "vllm:request_prompt_tokens_count"),
    ("kvtb-frontend-api", "frontend:8000", "kvtb:e2e_request_latency_seconds_count"),
    ("kvtb-smartnic", "smartnic:9101", "kvtb:triggered_ops_fired_total"),
    ("kvtb-compute", "compute:9102", "kvtb:turns_total"),
    ("kvtb-storage", "storage0:9103", "kvtb:storage_bytes_written_total"),
    ("kvtb-storage", "storage1:9103", "kvtb:storage_bytes_written_total"),
}


SECTIONS = ("storage", "smartnic", "compute", "frontend")  # a compose service's config section, by its name


def test_prometheus_has_every_services_metrics_port_and_the_scrape_token():
    """Each service's metrics bind 0.0.0.0 in its container (reachable on the compose network) and are a
    target of deploy/prometheus/prometheus.yml; its API port's job sends a metrics reader's token."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    config = yaml.safe_load((COMPOSE_FILE.parent / "kvtb.compose.yaml").read_text())
    prometheus = COMPOSE_FILE.parent / "prometheus" / "prometheus.yml"
    scrape = yaml.safe_load(prometheus.read_text())["scrape_configs"]
    targets = {t for job in scrape for group in job["static_configs"] for t in group["targets"]}
    served = 0
    for name, service in services.items():
        section = next((k for k in SECTIONS if name.startswith(k)), None)
        if section is None:
            continue
        env = service.get("environment") or {}
        address = env.get(f"KVTB_{section.upper()}_METRICS_ADDRESS", config[section]["metrics_address"])
        host, port = address.rsplit(":", 1)
        assert host == "0.0.0.0" and f"{name}:{port}" in targets, (name, address)
        served += 1
    assert served == 7  # two storage nodes, two pairs, the frontend
    (api,) = [job for job in scrape if job["job_name"] == "kvtb-frontend-api"]
    frontend = config["frontend"]
    assert api["static_configs"][0]["targets"] == [f"frontend:{frontend['http_address'].rsplit(':', 1)[1]}"]
    assert api["authorization"]["credentials"] in {frontend["users"][u] for u in frontend["metrics_readers"]}
    assert services["prometheus"]["profiles"] == ["monitoring"]


@pytest.mark.compose
@pytest.mark.slow
def test_prometheus_scrapes_every_service(deployment):
    """The profile monitoring's Prometheus (Debian's package, built here) scrapes every service over the
    compose network every 2 s: after a turn it holds each one's series; the second replica's targets
    (profile replicas, not started) are down."""
    deployment.start_monitoring()
    deployment.chat(RECIPE)
    query = 'group by (job, instance, __name__) ({__name__=~"(vllm|kvtb):.+"})'
    deadline, seen = time.monotonic() + 120, set()
    while time.monotonic() < deadline:
        try:
            rows = deployment.prometheus("/api/v1/query", query=query)["result"]
            seen = {(r["metric"]["job"], r["metric"]["instance"], r["metric"]["__name__"]) for r in rows}
        except OSError:  # Prometheus still starting
            pass
        if SCRAPED <= seen:
            break
        time.sleep(2)
    assert SCRAPED <= seen, (sorted(SCRAPED - seen), deployment.logs("prometheus"))
    turns = deployment.prometheus("/api/v1/query", query='sum(kvtb:requests_total{job="kvtb-frontend"})')
    assert float(turns["result"][0]["value"][1]) >= 1
    targets = {t["labels"]["instance"]: t["health"]
               for t in deployment.prometheus("/api/v1/targets")["activeTargets"]}
    assert targets["frontend:8000"] == "up" and targets["compute1:9102"] != "up", targets
    # every expression of the Grafana dashboard is PromQL this Prometheus evaluates (Grafana's variables set)
    dashboard = json.loads((COMPOSE_FILE.parent / "grafana" / "kvtestbed.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$frontend_job", "kvtb-frontend")
            deployment.prometheus("/api/v1/query", query=expr)  # a 400 for PromQL it cannot parse


def test_the_second_pair_has_identities_and_hosts_of_its_own():
    """Without the profile the frontend lists replica-0 alone; the second pair is replica-1 as
    kvtb.credentials names it, and every storage node allows both pairs' fabric hosts."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    services = compose["services"]
    assert services["frontend"]["environment"]["KVTB_FRONTEND_REPLICAS"] == \
        "${KVTB_FRONTEND_REPLICAS:-replica-0=smartnic:50051=smartnic}"
    assert TWO_REPLICAS.startswith("replica-0=smartnic:50051=smartnic,")
    agent, compute = credentials.replica_identities(1)
    agent_nqn, compute_nqn = credentials.replica_nqns(1)
    assert {k: v for k, v in services["smartnic1"]["environment"].items() if k in (
        "KVTB_SMARTNIC_IDENTITY", "KVTB_SMARTNIC_COMPUTE_IDENTITY", "KVTB_SMARTNIC_HOST_NQN",
        "KVTB_SMARTNIC_REPLICA")} == {"KVTB_SMARTNIC_IDENTITY": agent, "KVTB_SMARTNIC_COMPUTE_IDENTITY": compute,
                                     "KVTB_SMARTNIC_HOST_NQN": agent_nqn, "KVTB_SMARTNIC_REPLICA": "replica-1"}
    env = services["compute1"]["environment"]
    assert (env["KVTB_COMPUTE_IDENTITY"], env["KVTB_COMPUTE_AGENT_IDENTITY"], env["KVTB_COMPUTE_STORAGE_HOST_NQN"]) == \
        (compute, agent, compute_nqn)
    assert env["KVTB_COMPUTE_AGENT_ADDRESS"] == "smartnic1:50051" and services["smartnic1"]["ipc"] == "service:compute1"
    assert all(services[name]["profiles"] == ["replicas"] for name in ("smartnic1", "compute1"))
    assert "replicas" not in str(services["frontend"].get("depends_on"))  # it starts without the profile
    assert services["credentials"]["command"][-2:] == ["--replicas", "2"]
    config = yaml.safe_load((COMPOSE_FILE.parent / "kvtb.compose.yaml").read_text())
    allowed = config["storage"]["allowed_hosts"]
    assert {nqn for i in (0, 1) for nqn in credentials.replica_nqns(i)} == set(allowed)


@pytest.mark.compose
@pytest.mark.slow
def test_a_conversation_survives_its_compute_container_on_the_other_replica(deployment):
    """Last in this module (it adds the second pair to the module's deployment): a conversation's compute
    container killed with `docker kill`, its next turn is served by the other replica, restored from
    what the first stored, with the reply another user's same conversation got (both compute nodes run
    on every CPU: the same float math)."""
    deployment.add_second_replica()  # until the frontend has both in its rotation
    reference = [deployment.turn("bob-token", RECIPE)[1]]
    reference.append(deployment.turn("bob-token", CELSIUS, reference[0].context_id)[1])
    _, first = deployment.turn("alice-token", RECIPE)
    assert first.reply == reference[0].reply
    compute = {"replica-0": "compute", "replica-1": "compute1"}[first.replica]
    deployment.docker("kill", deployment.container(compute))
    text, second = deployment.turn("alice-token", CELSIUS, first.context_id)
    assert second.replica and second.replica != first.replica, (first.replica, second.replica, second.retried_from)
    assert second.kv_origin == "storage_other", (second.kv_origin, second.kv_source, second.fallback_reason)
    assert second.turn == 2 and text == second.reply == reference[1].reply
