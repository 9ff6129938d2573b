"""The SmartNIC agent (NIC-1 of the paper): `kvtb serve smartnic`, `kvtb bench smartnic`.

Pure logic (no zmq, grpc or torch; time passed in):
    triggered.py     the deferred work queue (fi_trigger semantics)
    match_action.py  P4Runtime-like tables: exact/lpm/ternary fields, priorities, default action
    requester.py     the hashmap (user, context) -> chunk descriptors, owner check, leases
    placement.py     rendezvous hashing of chunks over storage nodes
    eviction.py      LRU by capacity and idle timer policies
    chunk_format.py  a stored chunk (header + token ids + KV) and its key
    kv_layout.py     where a KV pool keeps what inside its region (shared with the compute node)
    gather.py        scatter-gather plans (runs of strided ranges), the gather and scatter copies
I/O:
    region.py, regions.py   registered shared memory and its counters
    engine.py        the counter watcher thread that fires queued entries
    datapath.py      PUT/GET of chunks between regions and storage nodes (ZeroMQ, one copy each way)
    fabric.py        queue pairs to the storage nodes, reconnected in the background
    agent.py         everything above wired together: restore, eviction loop, statistics
    *_servicer.py, compute_proxy.py   the gRPC services (SmartNic, MatchAction, ComputeNode proxy)
    main.py, settings.py, bench.py
"""
