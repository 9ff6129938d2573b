"""The host-local "PCIe" plane shared by the compute node and its SmartNIC agent.

    region.py       a named shared-memory region, mapped by its owner and by the agent, with
                    fi_cntr-like counters inside it
    counters.py     waiting on a counter by reading it (no syscall, no message)
    kv_layout.py    where a KV pool keeps what inside its region (pure arithmetic)
    layout_proto.py the layout to and from its registration message
    gather.py       scatter-gather plans (runs of strided ranges) and their copies
    dma.py          the copy engine: gather/scatter with the crc32c folded in (the compiled
                    `_dma.c` when built, numpy otherwise)
"""
