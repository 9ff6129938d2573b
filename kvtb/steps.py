"""The paper's eight steps (section III-A, Fig. 2 and 3), named once for every service and tool.

Every place that records a step (the compute node, the agent, the frontend) or draws one (the
chat client's timeline, the Chrome trace) takes its number and name from here.

    1 SETUP      once per compute node start: the KV pool is registered with the agent and the
                 triggered PUTs are armed
    2 INFERENCE  a first turn's prefill and decode; its KV leaves by triggered PUTs
    3 STREAM     the reply streamed to the user (the frontend)
    4 RELEASE    the turn's KV blocks released from compute memory for other users
    5 LOOKUP     the agent's match-action table and requester find the context's stored KV
    6 GET        GETs to the storage nodes (the agent)
    7 RESTORE    the KV lands in the compute node's region (the RDMA write) and is checked
    8 FOLLOW_UP  inference on the follow-up, over the restored KV; its new KV leaves as in 2
"""
from __future__ import annotations

import enum


class Step(enum.IntEnum):
    """A step's number, as in the paper."""

    SETUP = 1
    INFERENCE = 2
    STREAM = 3
    RELEASE = 4
    LOOKUP = 5
    GET = 6
    RESTORE = 7
    FOLLOW_UP = 8


NAMES: dict[Step, str] = {
    Step.SETUP: "setup: register the KV pool, arm triggered PUTs",
    Step.INFERENCE: "inference, KV out by triggered PUTs",
    Step.STREAM: "stream response to user",
    Step.RELEASE: "release KV from compute memory",
    Step.LOOKUP: "match-action and requester lookup",
    Step.GET: "KV GET from storage",
    Step.RESTORE: "restore lands in the region",
    Step.FOLLOW_UP: "follow-up inference",
}


def name(step: int) -> str:
    """The step's name; 'step N' for a number outside the eight."""
    try:
        return NAMES[Step(step)]
    except ValueError:
        return f"step {step}"
