"""The host-local "PCIe" plane shared by the compute node and its SmartNIC agent.

    region.py       a named shared-memory region, mapped by its owner and by the agent, with
                    fi_cntr-like counters inside it
    counters.py     waiting on a counter by reading it (no syscall, no message)
    kv_layout.py    where a paged KV pool keeps what inside its region (pure arithmetic)
descriptor.py   a block's descriptor: whose block it is and what it holds (the PUT reads it)
block_hash.py   the hash chain that names a block's content (prefix cache and stored blocks)
    layout_proto.py the layout to and from its registration message
    gather.py       scatter-gather plans (runs of strided ranges) and their copies
    dma.py          the copy engine: gather/scatter with the crc32c folded in (the compiled
                    `_dma.c` when built, numpy otherwise)
"""
