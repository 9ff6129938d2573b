"""Which services a gRPC server lists by reflection (for the services' node tests)."""
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from tests.conftest import secure_channel

HEALTH = "grpc.health.v1.Health"


def reflected_services(address: str) -> set[str]:
    with secure_channel(address) as channel:
        return set(ProtoReflectionDescriptorDatabase(channel).get_services())
