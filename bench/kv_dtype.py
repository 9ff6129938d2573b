"""What the KV pool's dtype does to the replies: greedy replies with the KV in bf16 and fp8 e4m3 against
fp32's, over the paper's chat and the local lm-eval task (tests/e2e/test_lm_eval.py's capitals).

    python -m bench.kv_dtype [--dtypes float32 bfloat16 float8_e4m3fn] [--max-new-tokens 128] [--json]

The real model's forward (compute_node.llama over a pool of each dtype, the compute node's own code),
in one process, greedy:
- the paper's chat (deploy/demo-chat.txt, as `make demo` runs it): each turn's prompt is the chat
  template over the conversation so far, with the replies that dtype gave, prefilled whole (as a
  recompute would), and up to --max-new-tokens tokens until the end of turn. A turn counts as identical
  when its reply's tokens equal fp32's; after a turn that differs, the later ones answer another
  conversation and are counted, but said so;
- the capitals task: "The capital of {country} is", up to 8 tokens until a newline or a full stop, at
  least one (lm-eval's until, max_gen_toks and min_tokens), scored as the task scores it (the first
  word, case and punctuation ignored, against the answer): identical to fp32's reply, and exact match.

Reports per dtype the share of identical replies in each, the exact-match score, the KV bytes a token,
and the first token where each differing reply leaves fp32's. No timing: this is about the replies.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import torch

from bench.results import emit_json, format_table, machine_info

DTYPES = ("float32", "bfloat16", "float8_e4m3fn")
CHAT = Path(__file__).resolve().parents[1] / "deploy" / "demo-chat.txt"
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Spain", "Madrid"),
            ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Greece", "Athens"), ("Russia", "Moscow"),
            ("China", "Beijing"), ("Austria", "Vienna"), ("Portugal", "Lisbon"), ("Norway", "Oslo"),
            ("Poland", "Warsaw"), ("Ireland", "Dublin"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
            ("Hungary", "Budapest"), ("Belgium", "Brussels"), ("Kenya", "Nairobi"), ("Peru", "Lima")]
CAPITAL_TOKENS, BLOCK_TOKENS, POOL_TOKENS = 8, 16, 4096


def chat_messages(path: Path = CHAT) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def first_word(text: str) -> str:
    """The task's filter: the first word (regex \\s*(\\w+)), lowered; "" when there is none."""
    found = re.match(r"\s*(\w+)", text)
    return found.group(1).lower() if found else ""


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


class Greedy:
    """Greedy decoding of one sequence at a time over a pool of one dtype (blocks 0.. in order)."""

    def __init__(self, model, dtype: str, pool_tokens: int = POOL_TOKENS):
        from compute_node.kv_pool import TORCH_DTYPES
        from compute_node.llama import pool_shape
        from compute_node.model_runner import ModelRunner
        pool = torch.zeros(pool_shape(model.config, pool_tokens // BLOCK_TOKENS, BLOCK_TOKENS),
                           dtype=TORCH_DTYPES[dtype])
        self.runner = ModelRunner(model, pool)
        self.table = list(range(pool_tokens // BLOCK_TOKENS))
        self.capacity = pool_tokens

    def run(self, ids: list[int], max_new: int, stop: set[int], min_new: int = 0) -> list[int]:
        from compute_node.model_runner import SeqRun
        if len(ids) + max_new > self.capacity:
            raise ValueError(f"{len(ids)} + {max_new} tokens do not fit the bench's pool of {self.capacity}")
        out: list[int] = []
        logits = self.runner.step([SeqRun(ids, 0, self.table)])[0]
        while len(out) < max_new:
            if len(out) < min_new:
                logits = logits.clone()
                logits[list(stop)] = float("-inf")
            token = int(logits.argmax())
            if token in stop:
                break
            out.append(token)
            logits = self.runner.step([SeqRun([token], len(ids) + len(out) - 1, self.table)])[0]
        return out


def run_dtype(model, tokenizer, dtype: str, max_new: int) -> dict:
    """One dtype's replies: the chat's turns and the capitals' answers (token ids and text)."""
    from compute_node.chat_template import ChatEncoder
    encoder, greedy = ChatEncoder(tokenizer), Greedy(model, dtype)
    eos = set(encoder.stop_token_ids)
    messages, chat = [], []
    for text in chat_messages():
        messages.append({"role": "user", "content": text})
        reply = greedy.run(encoder.encode(messages), max_new, eos)
        chat.append({"ids": reply, "text": encoder.decode(reply)})
        messages.append({"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)})
    capitals = []
    for country, answer in CAPITALS:
        # lm-eval stops at the first "\n" or "." in the text: the greedy tokens past it do not change what
        # comes before, so 8 tokens are generated and the text is cut there
        reply = greedy.run(encoder.encode_text(f"The capital of {country} is"), CAPITAL_TOKENS, eos, 1)
        text = re.split(r"[\n.]", encoder.decode(reply), maxsplit=1)[0]
        capitals.append({"ids": reply, "text": text, "match": first_word(text) == answer.lower()})
    kv_bytes = greedy.runner.pool[0, :, :, :, 0].numel() * greedy.runner.pool.element_size()
    return {"chat": chat, "capitals": capitals, "kv_bytes_per_token": kv_bytes}


def compare(runs: dict[str, dict], base: str = "float32") -> dict[str, dict]:
    """Each dtype against `base`: identical shares, exact match, where replies leave base's."""
    ref = runs[base]
    out = {}
    for dtype, r in runs.items():
        chat_same = [a["ids"] == b["ids"] for a, b in zip(r["chat"], ref["chat"])]
        cap_same = [a["text"] == b["text"] for a, b in zip(r["capitals"], ref["capitals"])]
        diverged = next((i for i, same in enumerate(chat_same) if not same), None)
        out[dtype] = {
            "kv_bytes_per_token": r["kv_bytes_per_token"],
            "chat_identical": share(chat_same), "chat_turns": len(chat_same),
            "chat_first_differing_turn": diverged,
            "chat_first_differing_token": (None if diverged is None else
                                           first_difference(r["chat"][diverged]["ids"], ref["chat"][diverged]["ids"])),
            "capitals_identical": share(cap_same), "capitals_items": len(cap_same),
            "capitals_exact_match": share([c["match"] for c in r["capitals"]]),
            "equal_to_base_everywhere": all(chat_same) and all(cap_same)}
    return out


def table(report: dict) -> str:
    rows = [[d, f"{c['kv_bytes_per_token']:,}", f"{c['chat_identical']:.0%} of {c['chat_turns']}",
             "-" if c["chat_first_differing_turn"] is None else
             f"turn {c['chat_first_differing_turn'] + 1}, token {c['chat_first_differing_token']}",
             f"{c['capitals_identical']:.0%} of {c['capitals_items']}", f"{c['capitals_exact_match']:.0%}"]
            for d, c in report["compare"].items()]
    lines = [format_table(["kv dtype", "KV bytes a token", "chat replies = fp32's", "chat leaves fp32's at",
                           "capitals = fp32's", "capitals exact match"], rows)]
    for d, r in report["runs"].items():
        lines.append(f"\n{d}: chat turn 1 reply: {r['chat'][0]['text'][:160]!r}")
    lines.append("\nafter a chat turn that differs, the later turns answer another conversation (each dtype's "
                 "own replies are in its history)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from compute_node import model_loader
    from compute_node.settings import ComputeSettings
    parser = argparse.ArgumentParser(prog="python -m bench.kv_dtype", description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES,
                        help="the pool dtypes (the first is the base the others are compared with)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="a chat reply's limit (make demo's 128)")
    parser.add_argument("--cache", default=os.path.expanduser(ComputeSettings().model_cache_dir),
                        help="the model cache (default: the compute node's)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be at least 1")
    model, tokenizer = model_loader.load_model(args.cache, args.threads)
    runs = {d: run_dtype(model, tokenizer, d, args.max_new_tokens) for d in args.dtypes}
    report = {"bench": "kv_dtype", "machine": machine_info(), "settings": vars(args), "runs": runs,
              "compare": compare(runs, args.dtypes[0])}
    if args.json:
        emit_json(report)
    else:
        print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
