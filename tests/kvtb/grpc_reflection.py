"""Which services a gRPC server lists by reflection (for the services' node tests)."""
import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

HEALTH = "grpc.health.v1.Health"


def reflected_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        return set(ProtoReflectionDescriptorDatabase(channel).get_services())
