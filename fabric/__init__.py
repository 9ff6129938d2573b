"""The host side of the NVMe-oF-style data plane, shared by the agent and the compute node's `cpu` policy.

    client.py        FabricClient: capsules over a ZeroMQ DEALER, pipelined, without copies
    status.py        NVMe status codes (SCT, SC) and NvmeError (the storage node answers with them)
    nodes.py         StorageNodes: queue pairs to several storage nodes, reconnected in the background
    placement.py     rendezvous hashing of chunks over storage nodes
    auth.py          who may use the fabric: allow list, DH-HMAC-CHAP at Connect, sealed capsules
    chunk_format.py  a stored chunk (header + token ids + MACs + KV) and its key
"""
