"""The compute node: the real LLM with its KV pool in registered memory (`kvtb serve compute`).

A turn (docs/contracts.md "A turn"): the frontend sends ComputeNode.Generate to the agent,
which may reserve a slot here (ReserveSlot) and GET the context's chunks into it; this node
waits on the slot's restore counter, verifies the restored token ids, prefills only what is
not covered, decodes and streams, and stores the slot's token count into its trigger
counter at each chunk boundary so the agent's triggered PUTs move the KV out (steps 2, 8).

Pure logic (no torch, grpc or I/O; time passed in):
    slots.py          free/reserved/active/resident/draining slots, leases, the bounded queue
    restore.py        waiting on a counter, and what a finished restore covers
    turn.py           a turn, its events and its record as plain values
    settings.py       ComputeSettings (section `compute`)
Model side:
    model_loader.py   SmolLM2-135M-Instruct from the wheel's GGUF file, cached as safetensors
    kv_pool.py        the region (hostmem) and its torch/numpy views: [slot, layer, K|V, kv_head, token, head_dim]
    slot_cache.py     a transformers cache whose layers write into (and return views of) a slot
    sampling.py, chat_template.py   next-token choice; conversation ids without re-tokenising
    runner.py         one turn: reuse or restore, prefill, decode, offload hooks
    engine.py         the engine thread: queue, slot assignment, release after the offload drained
Offload:
    offload.py        triggered (arm once, counter stores) and no-offload
    cpu_offload.py    the CPU-centric baseline: copy, store, wait for the ack; its own restore
    agent_client.py   RegisterMemory, QueueTriggered, CancelCounter, Restore
Service:
    compute_servicer.py, node.py (`serve`), main.py
Shared layers it uses: hostmem (region, counters, KV layout), fabric (for `cpu`: the storage
client, chunk format, placement), kvtb (settings, logs, metrics, steps).
"""
