"""The compute node: the real LLM batching many users' sequences over a paged KV pool (`kvtb serve compute`).

A turn (docs/contracts.md "A turn"): the frontend sends ComputeNode.Generate to the agent, which
finds how much of the turn's prefix is stored (step 5) and forwards it with `stored_tokens`; the
engine allocates the sequence's blocks (the pool's prefix cache first), asks the agent on the
stream for the stored blocks it lacks (steps 6, 7) and keeps decoding the others while they land;
each step runs one forward over every scheduled sequence; each block that fills leaves by the
agent's standing triggered PUT (the engine writes its descriptor and stores its trigger counter:
steps 2, 8); a finished turn's blocks are released (step 4).

Pure logic (no torch, grpc or I/O):
    sequence.py       a request: its tokens, block table and status
    block_manager.py  blocks, reference counts, the prefix cache by hash chain, I/O pins
    scheduler.py      continuous batching: admission, chunked prefill, preemption (swap, recompute)
    restore.py        a restore's blocks landing and what they cover
    turn.py, turn_state.py   a turn, its events and its record
    settings.py       ComputeSettings (section `compute`)
Model side:
    model_loader.py   SmolLM2-135M-Instruct from the wheel's GGUF file, cached as safetensors
    llama.py, paged_attention.py   our own Llama forward, attention through block tables
    model_runner.py   one forward per step over the batch
    kv_pool.py        the region (hostmem) and its views: [block, layer, K|V, kv_head, block_tokens, head_dim]
    sampling.py       next-token choice per sequence, batched: vLLM's sampling parameters, logprobs
    stop_strings.py   stop strings on the streamed text (held back while they may still match)
    grammar.py        structured output (JSON object, JSON schema) by constrained decoding (llguidance)
    chat_template.py  conversation ids without re-tokenising; raw text; token pieces
    engine.py         the engine thread: intake, schedule, forward, sample, offload, restores
Offload:
    offload.py        triggered (descriptor and counter store) and no offload
    cpu_offload.py    the CPU-centric baseline: copy, store, wait for the ack; its own restore
    agent_client.py   RegisterMemory (step 1), kept registered
Service:
    compute_servicer.py, node.py (`serve`), main.py
Shared layers it uses: hostmem (region, counters, KV layout, descriptors, hash chain), fabric (for
`cpu`: the storage client, chunk format, placement), kvtb (settings, logs, metrics, steps).
"""
