"""The compute node's one call to its SmartNIC agent (smartnic.proto): registration (step 1), kept up.

Everything after it goes through the registered region: descriptors and counter stores for the
standing PUTs, completion counters for the GETs. No RPC per block or per turn, and none while the
connection to the agent stays up (`keep_registered` watches it instead of asking).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from kvtb.rpc import Security, channel
from kvtb_proto import smartnic_pb2, smartnic_pb2_grpc

from compute_node.kv_pool import KvPool
from hostmem.layout_proto import layout_to_proto

logger = logging.getLogger(__name__)

# An agent that restarts is dialled again within 2 s of its coming back (gRPC's backoff grows to 120 s)
RECONNECT = (("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 2000))


class AgentClient:
    """One registered region at one agent. Thread-safe (gRPC stubs are)."""

    def __init__(self, address: str, security: Security, timeout_s: float = 10.0, peer: str = "smartnic"):
        """peer: the agent's identity (replica i's is smartnic-i: kvtb.credentials.replica_identities)."""
        self.address = address
        self.timeout_s = timeout_s
        self.channel = channel(address, security, peer=peer, options=RECONNECT)
        self.stub = smartnic_pb2_grpc.SmartNicStub(self.channel)
        self.region_id: int | None = None
        self.access_key = ""
        self._request: smartnic_pb2.RegisterMemoryRequest | None = None
        self._registering = threading.Lock()  # one check-and-register at a time

    def register(self, pool: KvPool, access_key: str, owner: str, compute_address: str,
                 deadline_s: float) -> int:
        """RegisterMemory (step 1), retrying until the agent answers or deadline_s passes."""
        request = smartnic_pb2.RegisterMemoryRequest(
            shm_name=pool.region.name, size_bytes=pool.region.size, access_key=access_key,
            counter_offset=pool.layout.counter_offset, counter_count=pool.layout.counter_count,
            kv_layout=layout_to_proto(pool.layout), owner=owner, compute_address=compute_address)
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                response = self.stub.RegisterMemory(request, timeout=self.timeout_s,
                                                    wait_for_ready=True)
                break
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                        or time.monotonic() > deadline:
                    raise
                logger.info("agent at %s not reachable yet (%s); retrying", self.address, exc.code())
                time.sleep(0.5)
        self.region_id, self.access_key, self._request = response.region_id, access_key, request
        logger.info("region %s registered with the agent at %s as region %d",
                    pool.region.name, self.address, self.region_id)
        return self.region_id

    def ensure_registered(self) -> bool:
        """Register again if the agent no longer knows the region (it restarted); True if it does now.

        A NIC that resets loses its memory registrations; the host registers again. Turns armed
        before the reset lose their unfired PUTs, as they would on the hardware.
        """
        with self._registering:
            return self._ensure_registered()

    def _ensure_registered(self) -> bool:
        if self._request is None or self.region_id is None:
            return False
        try:
            self.stub.CounterRead(self.counter_ref(0), timeout=2.0, wait_for_ready=True)
            return True
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                return False  # unreachable for now: try again later
        try:
            response = self.stub.RegisterMemory(self._request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            logger.warning("registering again with the agent at %s failed: %s", self.address, exc.details())
            return False
        logger.warning("the agent at %s lost region %d (it restarted): registered again as region %d",
                       self.address, self.region_id, response.region_id)
        self.region_id = response.region_id
        return True

    def keep_registered(self, stop: threading.Event, interval_s: float = 1.0,
                        on_change: Callable[[bool], None] | None = None, lost_after: int = 2) -> threading.Thread:
        """A daemon thread that keeps the region registered until stop is set, without an RPC while
        the connection to the agent stays up (a turn's decode never calls the agent): the channel's
        connectivity is watched, and once it left READY (the agent went away, and may come back
        without the region) ensure_registered runs every interval_s until it succeeds.

        on_change(False) once ensure_registered failed lost_after times in a row (the agent is gone),
        on_change(True) once it succeeds again (the agent is back and knows the region)."""
        check = threading.Event()
        failures = 0

        def watch(state: grpc.ChannelConnectivity) -> None:
            if state != grpc.ChannelConnectivity.READY:
                check.set()

        def notify(up: bool) -> None:
            if on_change is None:
                return
            try:
                on_change(up)
            except Exception:  # noqa: BLE001 - the keeper must outlive a bad callback
                logger.exception("the agent %s callback failed", "back" if up else "lost")

        def run() -> None:
            nonlocal failures
            while not stop.wait(interval_s):
                if check.is_set():
                    check.clear()  # first: a drop during the check sets it again
                    if self.ensure_registered():
                        if failures >= lost_after:
                            notify(True)
                        failures = 0
                    else:
                        failures += 1
                        check.set()
                        if failures == lost_after:
                            notify(False)
            self.channel.unsubscribe(watch)

        self.channel.subscribe(watch, try_to_connect=True)
        thread = threading.Thread(target=run, name="agent-registration", daemon=True)
        thread.start()
        return thread

    def deregister(self) -> None:
        if self.region_id is None:
            return
        try:
            self.stub.DeregisterMemory(smartnic_pb2.DeregisterMemoryRequest(
                region_id=self.region_id, access_key=self.access_key), timeout=5.0)
        except grpc.RpcError as exc:
            logger.warning("deregistering region %d failed: %s", self.region_id, exc.details())
        self.region_id = None

    def counter_ref(self, counter: int) -> smartnic_pb2.CounterRef:
        return smartnic_pb2.CounterRef(region_id=self.region_id, access_key=self.access_key,
                                       counter=counter)

    def close(self) -> None:
        self.channel.close()
