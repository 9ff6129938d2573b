"""ScaleLLM's gateway comparison on this testbed: the same load through the frontend's gRPC Chat API and
its OpenAI HTTP API, and the gateway's share of the latency through each.

ScaleLLM (Sec. 4.2, Figs. 6 and 7) replaces a FastAPI gateway over HTTP/1.1 with a Rust one over gRPC.
This testbed's frontend serves both protocols from one Python process: `c` clients send the same
questions back to back through each (the HTTP clients as the main study's; here the gRPC clients, one
grpc.aio channel, a `ChatRequest` each with the frontend's system prompt set to the study's), and each
request's engine time comes from its turn summary (the gRPC stream's last event carries it). A request
unfinished `timeout_s` after it was sent is cancelled at that moment and counted as a timeout.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import grpc

from bench.study.scalellm_figures import RequestRecord, stat
from kvtb_proto import frontend_pb2, frontend_pb2_grpc

PROTOCOLS = ("http", "grpc")


async def _turn(stub, token: str, client: int, user: str, message: str, max_tokens: int,
                timeout_s: float) -> RequestRecord:
    """One gRPC turn, cancelled at timeout_s."""
    start = time.perf_counter()
    first: list[float] = []
    call = stub.Chat(frontend_pb2.ChatRequest(token=token, message=message, max_new_tokens=max_tokens))

    async def read() -> frontend_pb2.TurnSummary | None:
        async for event in call:
            kind = event.WhichOneof("event")
            if kind == "text" and not first:
                first.append(time.perf_counter())
            elif kind == "summary":
                return event.summary
        return None

    try:
        summary = await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        call.cancel()
        return RequestRecord(client, "timeout", time.perf_counter() - start,
                             ttft_s=first[0] - start if first else None, user=user)
    except grpc.aio.AioRpcError as exc:
        return RequestRecord(client, "error", time.perf_counter() - start,
                             error=f"{exc.code().name}: {exc.details()}"[:300], user=user)
    end = time.perf_counter()
    if summary is None:
        return RequestRecord(client, "error", end - start, error="the stream ended without its summary", user=user)
    return RequestRecord(client, "ok", end - start, ttft_s=(first[0] if first else end) - start,
                         tokens=summary.tokens_out, prompt_tokens=summary.tokens_prefilled + summary.tokens_reused,
                         user=user, session_id=summary.context_id, engine_ms=summary.engine_ms,
                         frontend_e2e_ms=summary.e2e_ms, gateway_ms=summary.gateway_ms, replica=summary.replica)


async def run_grpc_clients(frontend: str, clients: Sequence[tuple[str, str]], questions: Sequence[Sequence[str]],
                           max_tokens: int, timeout_s: float,
                           done: Callable[[], None]) -> tuple[list[RequestRecord], float]:
    """len(clients) gRPC clients ((user, token) each) at once, each through its questions back to back;
    every record and the wall time from the common start to the last request's end."""
    async with grpc.aio.insecure_channel(frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)

        async def client(k: int, user: str, token: str) -> list[RequestRecord]:
            out = []
            for message in questions[k]:
                out.append(await _turn(stub, token, k, user, message, max_tokens, timeout_s))
                done()
            return out

        begin = time.perf_counter()
        per_client = await asyncio.gather(*(client(k, u, t) for k, (u, t) in enumerate(clients)))
        wall_s = time.perf_counter() - begin
    return [r for records in per_client for r in records], wall_s


def order(repeat: int) -> tuple[str, str]:
    """The protocols' order in a repeat: alternated, so that drift over the run favours neither."""
    return PROTOCOLS if repeat % 2 == 0 else PROTOCOLS[::-1]


def gateway_table(gateways: dict | None, virtual: bool = False) -> str:
    """One row per protocol: requests, timeouts, engine, gateway and its share, TTFT, tokens/s."""
    if not gateways:
        return ""
    unit = " (virtual)" if virtual else ""
    head = ["protocol", "requests", "completed", "timeouts", f"engine ms{unit}", f"gateway ms{unit}",
            "gateway share", "gateway share per repeat", "gateway from client ms", f"TTFT p50 ms{unit}",
            "tokens/s"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for p in PROTOCOLS:
        f = gateways.get(p)
        if not f:
            continue
        if "failed" in f:
            rows.append(f"| {p} | failed: {' '.join(str(f['failed']).replace('|', '/').split())} |"
                        + " |" * (len(head) - 2))
            continue
        per = ", ".join("-" if r.get("gateway_share") is None else f"{r['gateway_share']:.1%}"
                        for r in f.get("repeats") or [])

        def ms(key: str, which: str = "") -> str:
            v = stat(f, key, which) if which else f.get(key)
            return "-" if v is None else f"{v:.0f}"
        share = f.get("gateway_share")
        rows.append("| " + " | ".join([
            {"http": "HTTP (OpenAI API, SSE)", "grpc": "gRPC (Chat)"}[p], str(f["requests"]), str(f["completed"]),
            str(f["timeouts"]), ms("engine_ms_mean"), ms("gateway_ms_mean"),
            "-" if share is None else f"{share:.1%}", per or "-", ms("client_gateway_ms_mean"),
            ms("ttft_ms_incl_timeouts", "p50"),
            f"{(f.get('generated_tokens_per_s') or f['output_tokens_per_s']):.1f}"]) + " |")
    return "\n".join(rows)
