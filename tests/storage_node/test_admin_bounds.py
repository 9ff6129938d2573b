"""The admin port is bounded too: a request over 1 MiB is refused RESOURCE_EXHAUSTED before any handler
reads it, and the port goes on serving."""
from __future__ import annotations

import grpc
import pytest

from kvtb_proto import storage_admin_pb2 as apb
from kvtb_proto import storage_admin_pb2_grpc as apb_grpc
from storage_node.node import ADMIN_MAX_MESSAGE_BYTES, StorageNode
from tests.conftest import secure_channel

from .conftest import settings_for

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_an_oversized_admin_request_is_refused(tmp_path):
    node = StorageNode(settings_for(tmp_path, metrics_address="127.0.0.1:0"))
    node.start()
    try:
        channel = secure_channel(node.addresses["admin"], peer="storage")
        admin = apb_grpc.StorageAdminStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            admin.CreateNamespace(apb.CreateNamespaceRequest(command_set="x" * (ADMIN_MAX_MESSAGE_BYTES + 1)),
                                  timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert admin.Stats(apb.StatsRequest(), timeout=10).namespaces  # still serving
        assert sorted(node.subsystem.namespaces) == [1, 2]  # nothing was created
    finally:
        node.stop()
