"""The host side of the NVMe-oF-style data plane, shared by the agent and the compute node's `cpu` policy.

    client.py        FabricClient: capsules over a ZeroMQ DEALER, pipelined, without copies
    status.py        NVMe status codes (SCT, SC) and NvmeError (the storage node answers with them)
    nodes.py         StorageNodes: queue pairs to several storage nodes, reconnected in the background
    placement.py     rendezvous hashing of chunks over storage nodes
    chunk_format.py  a stored chunk (header + token ids + KV) and its key
"""
