"""The SmartNIC agent (NIC-1 of the paper): `kvtb serve smartnic`.

Pure logic (no zmq, grpc or torch; time passed in):
    triggered.py       the deferred work queue of one-off entries (fi_trigger semantics)
    standing.py        step 1's standing PUTs: one per pool block, armed at registration
    match_action.py    P4Runtime-like tables: exact/lpm/ternary fields, priorities, default action
    requester.py       the index of stored blocks by content hash, each context's blocks, leases
    eviction.py        LRU by capacity and idle timer policies over stored blocks
    ingress.py         step 5: the table's decision, the target, the stored prefix by content
    discovery.py       the miss path: a prompt's blocks the index lacks, asked of their storage
                       nodes (another replica may have stored them), and which answers to take
I/O:
    registrations.py   the compute nodes' regions this agent mapped (fi_mr_reg), by id and key
    watcher.py         the counter watcher thread: fires standing PUTs and queued entries
    datapath.py        PUT/GET of chunks between regions and storage nodes (ZeroMQ, one copy each way)
    agent.py           everything above wired together: block PUTs by descriptor, restores
                       (steps 6, 7), the eviction loop, statistics
    *_servicer.py      the gRPC services (SmartNic, MatchAction, the ComputeNode proxy), thin
    node.py, main.py, settings.py, stats.py, grpc_errors.py
Shared layers it uses: hostmem (region, layout, copy engine), fabric (storage client, chunk
format, placement, the pool of storage nodes), kvtb (settings, logs, metrics, steps).
"""
