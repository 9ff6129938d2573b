"""Which services a gRPC server lists by reflection (for the services' node tests)."""
import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from kvtb.grpc_health import securities
from kvtb.rpc import channel

HEALTH = "grpc.health.v1.Health"


def reflected_services(address: str) -> set[str]:
    """As the operator over mutual TLS (internal ports), else in plain text (the frontend's user port)."""
    for security in securities():
        with channel(address, security) as ch:
            try:
                return set(ProtoReflectionDescriptorDatabase(ch).get_services())
            except grpc.RpcError:
                continue
    raise ConnectionError(f"no reflection at {address}")
