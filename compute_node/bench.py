"""`kvtb bench offload`: what offload costs the compute process, with the real model.

Starts a storage node and the agent as real processes, runs the compute node in this
process (its gRPC server registered with the agent), and sends every turn through the
agent, as the frontend does. Measures, during a greedy decode of --decode-tokens tokens:
the mean time between tokens under resident, triggered and cpu, and the compute process's
own stall per offloaded chunk (the time its engine thread spent in offload, arming and
cancel calls included) under triggered and cpu. With --context-tokens N it also measures
the time to first token of a follow-up after an N-token conversation: restored,
resident and recomputed.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import grpc

from kvtb.bench import output, stats
from kvtb.bench.common import add_common_args, new_result
from kvtb.launch import ServiceProcess, kvtb_argv
from kvtb_proto import compute_pb2, compute_pb2_grpc

logger = logging.getLogger(__name__)

SALT = "bench-offload-salt"
FILLER = ("The history of bread begins with wild grains ground between stones, mixed with water "
          "and baked on hot embers; over centuries bakers learned to keep a sourdough starter. ")


def start_services(tmp: Path) -> tuple[ServiceProcess, ServiceProcess]:
    storage = ServiceProcess("storage", kvtb_argv("serve", "storage"), tmp / "storage.log", env={
        "KVTB_STORAGE_NODE_NAME": "bench-s0", "KVTB_STORAGE_DATA_DIR": str(tmp / "s0"),
        "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0", "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0",
        "KVTB_STORAGE_NAMESPACE_SIZE_BYTES": str(4 << 30)})
    storage.start()
    agent = ServiceProcess("smartnic", kvtb_argv("serve", "smartnic"), tmp / "smartnic.log", env={
        "KVTB_SMARTNIC_LISTEN_ADDRESS": "127.0.0.1:0", "KVTB_SMARTNIC_SALT": SALT,
        "KVTB_SMARTNIC_STORAGE_NODES": f"s0={storage.addresses['admin']}={storage.addresses['fabric']}"})
    try:
        agent.start()
    except BaseException:
        storage.stop()
        raise
    return storage, agent


def run_turn(stub, ids: list[int], context: str, policy: str, max_new: int, ignore_eos: bool = True):
    """The record of one turn streamed through the agent."""
    request = compute_pb2.TurnRequest(request_id=context, user_id="bench", context_id=context, token_ids=ids,
                                      max_new_tokens=max_new, policy=policy, ignore_eos=ignore_eos)
    record = None
    for event in stub.Generate(request, timeout=900):
        if event.HasField("record"):
            record = event.record
    return record


def encode(stub, text: str, previous=None) -> list[int]:
    request = compute_pb2.EncodeChatRequest(
        messages=[compute_pb2.ChatMessage(role="user", content=text)], add_generation_prompt=True,
        continuation=previous is not None, close_previous_turn=previous is not None)
    return list(stub.EncodeChat(request, timeout=60).token_ids)


def measure_decode(stub, args, progress) -> dict:
    """Mean TBT and stall per chunk for each offload policy, interleaved over --repeats rounds."""
    prompt = encode(stub, "Tell me a long story about a baker who travels the world.")
    run_turn(stub, prompt, f"warmup-{uuid.uuid4().hex[:8]}", "resident", 16)
    per = {p: {"tbt_ms": [], "stall_per_chunk_ms": [], "chunks": [], "stall_ms": []}
           for p in ("resident", "triggered", "cpu")}
    for _ in range(args.repeats):
        for policy in per:
            rec = run_turn(stub, prompt, f"{policy}-{uuid.uuid4().hex[:8]}", policy, args.decode_tokens)
            per[policy]["tbt_ms"].append(rec.tbt_ms)
            per[policy]["chunks"].append(rec.chunks_offloaded)
            per[policy]["stall_ms"].append(rec.offload_stall_ms)
            if rec.chunks_offloaded:
                per[policy]["stall_per_chunk_ms"].append(rec.offload_stall_ms / rec.chunks_offloaded)
            progress.update(1)
    return {policy: {"tbt_ms": stats.mean(v["tbt_ms"]), "tbt_ms_runs": v["tbt_ms"],
                     "stall_per_chunk_ms": stats.mean(v["stall_per_chunk_ms"]) if v["stall_per_chunk_ms"] else 0.0,
                     "stall_ms_runs": v["stall_ms"], "chunks_per_turn": stats.mean(v["chunks"])}
            for policy, v in per.items()} | {"prompt_tokens": len(prompt)}


def measure_restore(stub, args, progress) -> dict:
    """TTFT of a follow-up after a long first turn, per policy."""
    text = FILLER * max(1, args.context_tokens // 30)  # ~35 tokens each: a little more than asked
    prompt = encode(stub, text + " Summarise this.")[:args.context_tokens]
    out = {}
    for policy in ("triggered", "resident", "recompute"):
        context = f"long-{policy}-{uuid.uuid4().hex[:8]}"
        first = run_turn(stub, prompt, context, policy, 8, ignore_eos=False)
        follow = prompt + list(first.output_token_ids) + encode(stub, "And in one word?", first)
        second = run_turn(stub, follow, context, policy, 4, ignore_eos=False)
        out[policy] = {"ttft_ms": second.ttft_ms, "kv_source": second.kv_source,
                       "tokens_prefilled": second.tokens_prefilled, "tokens_reused": second.tokens_reused,
                       "bytes_restored": second.bytes_restored, "fallback_reason": second.fallback_reason}
        progress.update(1)
    out["context_tokens"] = len(follow)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb bench offload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser, "offload")
    parser.add_argument("--decode-tokens", type=int, default=256, help="tokens decoded per turn (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="turns per policy (default 3)")
    parser.add_argument("--chunk-tokens", type=int, default=32, help="tokens per offloaded chunk (default 32)")
    parser.add_argument("--context-tokens", type=int, default=0,
                        help="also time a follow-up after a conversation of this many tokens (e.g. 2048)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from compute_node.main import build_node
    from compute_node.model_loader import load_model
    from compute_node.settings import ComputeSettings
    from kvtb.bench.common import progress_for

    max_tokens = max(1024, args.context_tokens + 256)
    tmp = Path(tempfile.mkdtemp(prefix="kvtb-bench-offload-"))
    storage, agent = start_services(tmp)
    settings = ComputeSettings(policy="triggered", num_slots=4, max_context_tokens=max_tokens,
                               chunk_tokens=args.chunk_tokens, listen_address="127.0.0.1:0",
                               agent_address=agent.addresses["grpc"], key_salt=SALT,
                               storage_fabric_addresses=(storage.addresses["fabric"],), node_name="bench")
    close, ok = None, False
    try:
        model, tokenizer = load_model(settings.model_cache_dir, settings.torch_threads)
        server, engine, address, health, close = build_node(settings, model, tokenizer)
        server.start()
        health.set_serving()
        stub = compute_pb2_grpc.ComputeNodeStub(grpc.insecure_channel(agent.addresses["grpc"]))
        progress = progress_for(args, 3 * args.repeats + (3 if args.context_tokens else 0), "offload")
        started = time.monotonic()
        decode = measure_decode(stub, args, progress)
        restore = measure_restore(stub, args, progress) if args.context_tokens else None
        progress.close()
        ok = True
    finally:
        if close is not None:
            close()
        agent.stop()
        storage.stop()
        if ok:  # the services' files go; after a failure their logs stay, to look at
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            logger.warning("the services' files are kept in %s", tmp)
    result = new_result("offload", {"decode_tokens": args.decode_tokens, "repeats": args.repeats,
                                    "chunk_tokens": args.chunk_tokens, "context_tokens": args.context_tokens,
                                    "storage_fsync": True, "torch_threads": settings.torch_threads})
    result["results"] = {"decode": decode, "seconds": time.monotonic() - started}
    tbt = {p: decode[p]["tbt_ms"] for p in ("resident", "triggered", "cpu")}
    stall = {p: decode[p]["stall_per_chunk_ms"] for p in ("triggered", "cpu")}
    result["ratios"] = {"triggered_tbt_vs_resident": stats.ratio(tbt["triggered"], tbt["resident"]),
                        "cpu_tbt_vs_resident": stats.ratio(tbt["cpu"], tbt["resident"]),
                        "cpu_stall_vs_triggered": stats.ratio(stall["cpu"], stall["triggered"])}
    if restore is not None:
        result["results"]["follow_up"] = restore
        result["ratios"]["recompute_ttft_vs_restored"] = stats.ratio(restore["recompute"]["ttft_ms"],
                                                                     restore["triggered"]["ttft_ms"])
        result["ratios"]["restored_ttft_vs_resident"] = stats.ratio(restore["triggered"]["ttft_ms"],
                                                                    restore["resident"]["ttft_ms"])
    output.write_json(args.out, "offload.json", result)
    if args.json:
        output.emit_json(result)
    else:
        print(render(result))
    return 0


def render(result: dict) -> str:
    """The readable tables."""
    d = result["results"]["decode"]
    rows = [[p, round(d[p]["tbt_ms"], 2), round(d[p]["stall_per_chunk_ms"], 3) if p != "resident" else "-",
             round(d[p]["chunks_per_turn"], 1)] for p in ("resident", "triggered", "cpu")]
    text = [f"decode of {result['settings']['decode_tokens']} tokens after a {d['prompt_tokens']}-token prompt, "
            f"chunks of {result['settings']['chunk_tokens']} tokens:",
            output.format_table(["policy", "mean TBT ms", "stall per chunk ms", "chunks"], rows)]
    f = result["results"].get("follow_up")
    if f:
        rows = [[p, round(f[p]["ttft_ms"], 1), f[p]["kv_source"], f[p]["tokens_prefilled"], f[p]["tokens_reused"]]
                for p in ("triggered", "resident", "recompute")]
        text += ["", f"follow-up after {f['context_tokens']} tokens:",
                 output.format_table(["policy", "TTFT ms", "kv_source", "prefilled", "reused"], rows)]
    text += ["", "ratios: " + ", ".join(f"{k} {v:.3g}" for k, v in result["ratios"].items())]
    return "\n".join(text)
