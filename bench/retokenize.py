"""How often a stateless client's resent history has the token ids the X-Session-Id path keeps.

The X-Session-Id path keeps each reply's ids as the model generated them; a client that resends
the whole history sends the reply as text, which the frontend encodes with the chat template
again. The real model (SmolLM2-135M-Instruct, transformers' generate) answers each prompt greedily
and sampled; for each reply this reports whether the re-tokenised reply equals its generated ids,
and whether the whole conversation (user, reply, follow-up) rendered by the template equals the
X-Session-Id path's ids (first turn + generated ids + the template's continuation); where not, how
many leading tokens and whole blocks still agree (what a content-addressed lookup still finds).

    python -m bench.retokenize [--max-new-tokens 80] [--block-tokens 32] [--modes greedy ...] [--show] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import time

PROMPTS = [
    "Give me a simple cheesecake recipe.",
    "Only give temperatures in °C from now on. How hot should the oven be for bread?",
    "Write a Python function that reverses a linked list.",
    "What is 17 times 23? Show your steps.",
    "List five colours of the rainbow as a bulleted list.",
    "Translate 'good morning, how are you?' into French and German.",
    "Explain what a KV cache is in one paragraph.",
    "Write a haiku about autumn leaves.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "Give me a JSON object describing a book with title, author and year.",
    "How do I make a cup of green tea? Use numbered steps.",
    "Write a short email asking a colleague to reschedule a meeting.",
    "What are the differences between TCP and UDP?",
    "Tell me a joke about computers.",
    "Name three famous physicists and one discovery of each.",
    "Write a SQL query that counts orders per customer.",
    "What does the word 'ephemeral' mean? Use it in a sentence.",
    "Describe the water cycle for a ten-year-old.",
    "Convert 5 miles to kilometres and explain the formula.",
]
FOLLOW_UP = "Thanks! Can you make it shorter?"
MODES = {"greedy": {"do_sample": False}, "t=0.7": {"do_sample": True, "temperature": 0.7, "top_p": 0.95},
         "t=1.0": {"do_sample": True, "temperature": 1.0}}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def measure(model, tokenizer, encoder, prompt: str, mode: dict, max_new: int, block_tokens: int,
            show: bool = False) -> dict:
    """One reply: equalities, and the agreeing prefix of the conversation (tokens, whole blocks)."""
    import torch

    from compute_node.chat_template import StreamDecoder
    first = [{"role": "user", "content": prompt}]
    prompt_ids = encoder.encode(first)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new, pad_token_id=tokenizer.eos_token_id,
                             eos_token_id=tokenizer.eos_token_id, **mode)
    generated = out[0, len(prompt_ids):].tolist()
    decoder = StreamDecoder(tokenizer)
    text = "".join(decoder.push(i) for i in generated)  # the text the frontend streams and stores
    eos = tokenizer.eos_token_id
    reply_ids = generated[:-1] if generated and generated[-1] == eos else generated
    closed = [*reply_ids, eos]
    session = prompt_ids + closed + encoder.encode([{"role": "user", "content": FOLLOW_UP}], continuation=True)
    whole = encoder.encode(first + [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UP}])
    agree = common_prefix(session, whole)
    if show and session != whole:
        print(f"differs at token {agree}: generated {session[agree:agree + 4]} "
              f"{tokenizer.convert_ids_to_tokens(session[agree:agree + 4])}, re-tokenised {whole[agree:agree + 4]} "
              f"{tokenizer.convert_ids_to_tokens(whole[agree:agree + 4])}; reply ends {text[-20:]!r}")
    return {"reply_equal": tokenizer.encode(text, add_special_tokens=False) == reply_ids,
            "conversation_equal": session == whole, "stopped": generated[-1:] == [eos],
            "tokens": len(session), "agree_tokens": agree,
            "blocks": len(session) // block_tokens, "agree_blocks": agree // block_tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retokenize", description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--block-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--show", action="store_true", help="print where each differing conversation differs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from compute_node.chat_template import ChatEncoder
    from compute_node.model_loader import load_model
    from compute_node.settings import ComputeSettings
    model, tokenizer = load_model(ComputeSettings().model_cache_dir, threads=args.threads, reference=True)
    encoder = ChatEncoder(tokenizer)
    results: dict[str, list[dict]] = {}
    start = time.monotonic()
    for name in args.modes:
        torch.manual_seed(0)
        results[name] = [measure(model, tokenizer, encoder, p, MODES[name], args.max_new_tokens, args.block_tokens,
                                 args.show) for p in PROMPTS]
    report = {"replies_per_mode": len(PROMPTS), "max_new_tokens": args.max_new_tokens,
              "block_tokens": args.block_tokens, "seconds": round(time.monotonic() - start, 1), "modes": {}}
    for name, rows in results.items():
        report["modes"][name] = {
            "reply_ids_equal": sum(r["reply_equal"] for r in rows),
            "conversation_ids_equal": sum(r["conversation_equal"] for r in rows),
            "stopped": sum(r["stopped"] for r in rows),
            "agreeing_token_share": round(sum(r["agree_tokens"] for r in rows) / sum(r["tokens"] for r in rows), 4),
            "agreeing_block_share": round(sum(r["agree_blocks"] for r in rows) / max(1, sum(r["blocks"] for r in rows)), 4)}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{len(PROMPTS)} replies per mode, up to {args.max_new_tokens} tokens, {report['seconds']} s")
        for name, m in report["modes"].items():
            print(f"{name:7s} reply ids equal {m['reply_ids_equal']}/{len(PROMPTS)}, conversation ids equal "
                  f"{m['conversation_ids_equal']}/{len(PROMPTS)} ({m['stopped']} stopped, the rest cut at "
                  f"max tokens); agreeing prefix {m['agreeing_token_share']:.1%} of tokens, "
                  f"{m['agreeing_block_share']:.1%} of whole blocks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
