"""The compute node as a service: the LLM, its KV pool, the engine, the ComputeNode gRPC server and
metrics (`serve`).

start() creates the pool and registers it with the agent (step 1, once per start), then serves.

Its agent gone (killed, restarting: a NIC reset), the node waits for it with its pool kept: health
NOT_SERVING and every turn refused with UNAVAILABLE ("its SmartNIC agent ... is gone"), Info and Stats
still answered; once the agent answers again the node registers its region with it again (the agent
lost it) and serves. `kvtb up` restarts a dead agent on its address; the node never exits for it.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from concurrent import futures

import grpc

from compute_node.settings import ComputeSettings
from compute_node.turn import StepSpan
from hostmem.region_reclaim import reclaim_abandoned
from kvtb.grpc_health import Health, add_health_and_reflection
from kvtb.metrics import MetricsEndpoint
from kvtb.rpc import Authorizer, Security, add_port, server_options
from kvtb.service_metrics import compute_families
from kvtb.steps import Step
from kvtb_proto import compute_pb2, compute_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = compute_pb2.DESCRIPTOR.services_by_name["ComputeNode"].full_name
CONTROL_CALLS = 64  # threads and streams beside the turns' (Info, Stats, EncodeChat, Decode, health)


def access(agent_identity: str = "smartnic") -> dict[str, set[str]]:
    """Only the agent in front of this node sends it turns (and the operator: kvtb.rpc.Authorizer):
    its own agent's identity, not another replica's."""
    return {f"/{SERVICE_NAME}/*": {agent_identity}}


ACCESS = access()  # replica 0's


def cpu_store_security(s: ComputeSettings) -> dict:
    """The `cpu` policy's fabric security and chunk MAC key, from the deployment's credentials."""
    from fabric.auth import FabricSecurity
    from kvtb.credentials import Credentials, resolve_dir
    mac_key = Credentials(resolve_dir(s.credentials_dir), s.identity).kv_mac_key() if s.kv_mac else None
    return {"security": FabricSecurity.for_host(s.fabric_security, s.credentials_dir, s.storage_host_nqn),
            "mac_key": mac_key}


def serve(settings: ComputeSettings, model=None, tokenizer=None) -> ComputeNode:
    """The compute node of these settings, not started; without a model, start() loads SmolLM2."""
    return ComputeNode(settings, model, tokenizer)


class ComputeNode:
    """The running compute node (a kvtb.node.Node). Not thread-safe: one owner starts and stops it."""

    service = "compute"

    def __init__(self, settings: ComputeSettings, model=None, tokenizer=None):
        self.settings = settings
        self.model, self.tokenizer = model, tokenizer
        self.pool = self.agent = self.cpu_store = self.engine = self.servicer = None
        self.server: grpc.Server | None = None
        self.health: Health | None = None
        self.metrics: MetricsEndpoint | None = None
        self.addresses: dict[str, str] = {}
        self._keeper_stop = threading.Event()
        self._agent_lost = ""  # why turns are refused while the agent is gone; "" while it answers

    def start(self) -> None:
        """Load the model (if not given), create and register the pool, start the engine and serve."""
        from compute_node.agent_client import AgentClient
        from compute_node.chat_template import ChatEncoder
        from compute_node.compute_servicer import ComputeNodeServicer
        from compute_node.cpu_offload import CpuOffload, CpuStore
        from compute_node.engine import Engine
        from compute_node.kv_pool import KvPool, layout_for
        from compute_node.offload import NoOffload, TriggeredOffload

        s = self.settings
        if self.model is None:
            from compute_node.model_loader import load_model
            from compute_node.torch_threads import thread_count
            from kvtb.placement import current_cpus
            # 0: one thread per CPU of its set (kvtb serve compute pinned the process to `cpus`)
            self.model, self.tokenizer = load_model(s.model_cache_dir, thread_count(s.torch_threads, current_cpus()))
        layout = layout_for(self.model.config, s.num_blocks, s.block_tokens, s.layer_groups, s.kv_dtype)
        for name in reclaim_abandoned(s.shm_prefix):  # a kill -9 leaves the region in /dev/shm
            logger.warning("removed the region %s that a node %s left when it died", name, s.node_name)
        self.pool = KvPool.create(s.shm_name, layout)
        self.security = Security.of(s.identity, s.credentials_dir, s.insecure)
        # a turn's stream holds a thread while it waits in the scheduler or runs: enough for every turn the
        # engine takes (queue_bound waiting, max_num_seqs running), so turns wait in the fair scheduler
        turns = s.queue_bound + s.max_num_seqs + s.newcomer_slots
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=turns + CONTROL_CALLS,
                                                             thread_name_prefix="compute-grpc"),
                                  options=server_options(max_concurrent_streams=turns + CONTROL_CALLS),
                                  interceptors=[Authorizer(access(s.agent_identity), self.security)])
        port = add_port(self.server, s.listen_address, self.security)
        if not port:
            raise OSError(f"cannot listen on {s.listen_address}")
        address = f"{s.listen_address.rsplit(':', 1)[0]}:{port}"
        setup = self._register(AgentClient, address) if s.agent_address else None
        offloaders = {"resident": NoOffload(), "recompute": NoOffload()}
        if self.agent is not None:
            offloaders["triggered"] = TriggeredOffload(self.pool, s.drain_timeout_s)
        if s.storage_fabric_addresses:
            self.cpu_store = CpuStore(s.storage_fabric_addresses, s.storage_host_nqn, s.storage_nsid, s.key_salt,
                                      **cpu_store_security(s))
            offloaders["cpu"] = CpuOffload(self.pool, self.cpu_store)
        self.engine = Engine(s, self.model, self.tokenizer, self.pool, offloaders, cpu_store=self.cpu_store,
                             setup_span=setup)
        self.engine.region_id = lambda: (self.agent.region_id or 0) if self.agent is not None else 0
        self.engine.start()
        self.servicer = ComputeNodeServicer(self.engine, ChatEncoder(self.tokenizer), unavailable=self.unavailable)
        if self.agent is not None:
            self.agent.keep_registered(self._keeper_stop, on_change=self._agent_changed)
        compute_pb2_grpc.add_ComputeNodeServicer_to_server(self.servicer, self.server)
        self.health = add_health_and_reflection(self.server, [SERVICE_NAME])
        self.server.start()
        self.metrics = MetricsEndpoint(s.metrics_address, lambda: compute_families(self.engine.snapshot()))
        self.addresses = {"grpc": address, "metrics": self.metrics.address}
        self.health.set_serving()
        if self._agent_lost:  # the agent went away while the server started
            self.health.set_not_serving()
        logger.info("compute node serving on %s (policy %s)", address, s.policy)

    def _register(self, client_class, address: str) -> StepSpan | None:
        """Step 1: register the pool with the agent; the span, or None when running without it."""
        s = self.settings
        agent = client_class(s.agent_address, self.security, peer=s.agent_identity)
        needed = s.policy == "triggered" or s.require_agent
        start_ns = time.time_ns()
        try:
            agent.register(self.pool, s.access_key or secrets.token_hex(16), s.node_name,
                           s.advertise_address or address, s.register_timeout_s if needed else 2.0)
        except grpc.RpcError as exc:
            agent.close()
            if needed:
                raise RuntimeError(f"cannot register the KV pool with the agent at {s.agent_address}: "
                                   f"{exc.code()} {exc.details()}") from exc
            logger.info("running without the agent (%s): policies resident, recompute and cpu only", exc.code())
            return None
        self.agent = agent
        return StepSpan(Step.SETUP, start_ns, time.time_ns(), self.pool.layout.region_bytes)

    def unavailable(self) -> str:
        """Why a turn is refused now (UNAVAILABLE), "" when it is not."""
        return self._agent_lost

    def _agent_changed(self, up: bool) -> None:
        """The keeper's word: the agent is gone (wait for it, pool kept) or back (the region registered again)."""
        if self._keeper_stop.is_set():
            return  # stopping
        if up:
            self._agent_lost = ""
            logger.warning("the SmartNIC agent at %s is back (region %s registered again): serving",
                           self.settings.agent_address, self.agent.region_id if self.agent else "?")
            if self.health:
                self.health.set_serving()
            return
        self._agent_lost = (f"the compute node's SmartNIC agent at {self.settings.agent_address} is gone; the node "
                            "waits for it to come back (its KV pool kept) and takes no turn meanwhile")
        logger.warning("%s", self._agent_lost)
        if self.health:
            self.health.set_not_serving()

    def ready_extra(self) -> dict:
        import torch
        return {"policy": self.settings.policy, "policies": self.engine.policies() if self.engine else [],
                "torch_threads": torch.get_num_threads(),
                # what `kvtb up` removes if this process dies without removing it (kill -9)
                "regions": [str(self.pool.region.path)] if self.pool is not None else []}

    def stop(self) -> None:
        """Stop serving, stop the engine, deregister the pool and free it."""
        self._keeper_stop.set()  # first: the keeper sets no health from now on
        if self.health:
            self.health.set_not_serving()
        if self.server:
            self.server.stop(grace=2.0).wait()
        if self.engine:
            self.engine.stop()
        if self.servicer is not None:
            self.servicer.close()
        if self.agent is not None:
            self.agent.deregister()
            self.agent.close()
        if self.cpu_store is not None:
            self.cpu_store.close()
        if self.metrics:
            self.metrics.close()
        if self.pool is not None:
            self.pool.close()
