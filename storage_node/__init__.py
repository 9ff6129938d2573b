"""The storage node: an NVMe-oF-style target that keeps KV chunks in files.

Logic (no zmq, no grpc):
    allocator.py     extent allocator (best fit, scatter when fragmented, coalescing frees)
    journal.py       append-only index journal: numbered, crc32c records; replay skips damage in
                     the middle (and reports it), cuts a torn tail; reads version-1 journals
    replay.py        records -> key index, setting aside values whose extents a newer one holds
    queues.py        queue pair per host: depth, command ids, a bounded number parked, the rest
                     refused "command interrupted" (retryable), sq head
    namespace.py     file-backed namespaces, zero-copy extent I/O, the NVM block namespace
    kv_namespace.py  the key-value namespace: index, atomic replace, crc32c on every Retrieve
                     (unless the host checks it itself: NVMe's PRCHK guard bit clear); a data
                     file cut short loses the values past the cut, not the process
    commit.py        group commit (one data fdatasync + one journal fsync per batch, on its own thread)
    stall_watch.py   stalls over 1 s (the fabric thread busy, a command outstanding) logged with
                     what they wait on
    leases.py        read leases (lease_ms): a Delete of a key another host leased is refused
    manifest.py      subsystem.json: read, or rebuilt from its good entries and the data files
    subsystem.py     namespaces (a damaged one is offline, not fatal), access list, host controllers
    handlers.py      per-opcode validation and execution
    commands.py      capsule -> access check -> queue admission -> dispatch -> response
    settings.py      StorageSettings (section `storage`)
    stats.py
I/O:
    fabric_server.py (the ZeroMQ ROUTER front end), admin_servicer.py (StorageAdmin gRPC),
    node.py (`serve`), main.py (`kvtb serve storage`)
Shared layers it uses: fabric (NVMe status codes; the host side, FabricClient, lives there too),
kvtb (crc32c, settings, logs, metrics).
"""
