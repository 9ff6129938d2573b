"""The scheduler: admission, token budget, chunked prefill, preemption, restores (pure)."""
from __future__ import annotations

import pytest

from compute_node.block_manager import BlockManager
from compute_node.scheduler import NeverFits, QueueFull, Scheduler
from compute_node.sequence import Sequence, SequenceStatus

BT = 4


def make(num_blocks=32, max_num_seqs=8, budget=64, preemption="recompute", max_waiting=16, stop=(),
         pin_finished=False):
    return Scheduler(BlockManager(num_blocks, BT), max_num_seqs, budget, preemption, max_waiting, stop,
                     pin_finished)


def seq(n, max_new=4, start=0, salt=b"s"):
    return Sequence(list(range(start, start + n)), max_new_tokens=max_new, block_tokens=BT, salt=salt)


def model(s: Sequence) -> int:
    """A deterministic stand-in for the model: the next token from the tokens so far (never 0)."""
    return (sum(s.token_ids) * 31 + len(s)) % 50 + 1


def step(sched, next_token=model):
    out = sched.schedule()
    finished = sched.postprocess(out, [next_token(s) for s in out.sampling])
    return out, finished


def work(out):
    """{seq_id: (start, num_tokens, samples)} of a step."""
    return {s.seq.seq_id: (s.start, s.num_tokens, s.samples) for s in out.scheduled}


def solo(tokens, max_new, salt=b"s"):
    """The completion a sequence gets alone in a large pool."""
    sched = make(num_blocks=64)
    s = Sequence(list(tokens), max_new_tokens=max_new, block_tokens=BT, salt=salt)
    sched.add(s)
    while sched.has_work():
        step(sched)
    return s.completion_token_ids


def run_all(sched, limit=500):
    """Steps to the end; swap-outs are stored and restores land at once."""
    for _ in range(limit):
        if not sched.has_work():
            return
        out, _ = step(sched)
        for swap in out.swapped_out:
            sched.release_pins(swap.seq)
        for restore in out.restores:
            sched.restore_done(restore.seq, restore.num_tokens)
    raise AssertionError("the scheduler did not finish")


# -- admission
def test_admission_waits_for_free_blocks_in_order():
    sched = make(num_blocks=4)
    a, b, c = seq(8, max_new=1), seq(8, max_new=1, start=10), seq(8, max_new=1, start=20)
    for s in (a, b, c):
        sched.add(s)
    out, finished = step(sched)
    assert out.admitted == [a, b] and work(out) == {a.seq_id: (0, 8, True), b.seq_id: (0, 8, True)}
    assert list(sched.waiting) == [c] and finished == [a, b]
    out, _ = step(sched)
    assert out.admitted == [c] and sched.bm.num_free_blocks == 4


def test_admission_stops_at_max_num_seqs():
    sched = make(max_num_seqs=2)
    a, b, c = seq(3, max_new=3), seq(3, max_new=3, start=10), seq(3, max_new=3, start=20)
    for s in (a, b, c):
        sched.add(s)
    out, _ = step(sched)
    assert out.admitted == [a, b]
    out, _ = step(sched)
    assert out.admitted == [] and set(work(out)) == {a.seq_id, b.seq_id} and sched.num_running == 2
    assert sched.num_waiting == 1


def test_the_token_budget_chunks_the_last_admitted_prefill():
    sched = make(budget=10)
    a, b, c = seq(6, max_new=5), seq(6, max_new=5, start=10), seq(6, max_new=5, start=20)
    for s in (a, b, c):
        sched.add(s)
    out, _ = step(sched)
    assert work(out) == {a.seq_id: (0, 6, True), b.seq_id: (0, 4, False)} and out.num_batched_tokens == 10
    out, _ = step(sched)  # a's decode first, then the rest of b, then c with what is left
    assert [s.seq for s in out.scheduled] == [a, b, c]
    assert work(out) == {a.seq_id: (6, 1, True), b.seq_id: (4, 2, True), c.seq_id: (0, 6, True)}
    assert len(b.completion_token_ids) == 1


def test_a_long_prompt_prefills_over_several_steps_beside_the_decodes():
    sched = make(budget=8, max_num_seqs=4)
    a, b = seq(3, max_new=10), seq(20, max_new=2, start=100)
    sched.add(a)
    sched.add(b)
    steps = [work(step(sched)[0]) for _ in range(4)]
    assert steps[0] == {a.seq_id: (0, 3, True), b.seq_id: (0, 5, False)}
    assert steps[1] == {a.seq_id: (3, 1, True), b.seq_id: (5, 7, False)}
    assert steps[2] == {a.seq_id: (4, 1, True), b.seq_id: (12, 7, False)}
    assert steps[3] == {a.seq_id: (5, 1, True), b.seq_id: (19, 1, True)}
    assert len(a.completion_token_ids) == 4 and len(b.completion_token_ids) == 1
    run_all(sched)
    assert a.completion_token_ids == solo(range(3), 10)
    assert b.completion_token_ids == solo(range(100, 120), 2)


def test_a_step_reports_the_blocks_it_fills():
    sched = make(budget=6, max_num_seqs=2)
    a = seq(10, max_new=3)
    sched.add(a)
    out, _ = step(sched)
    assert list(out.scheduled[0].filled_blocks) == [0]  # tokens 0-5: block 0 complete, block 1 not
    out, _ = step(sched)
    assert list(out.scheduled[0].filled_blocks) == [1]  # tokens 6-9


# -- preemption
def two_growing(preemption):
    """Two sequences in 6 blocks that both cross into a fourth block at the same decode."""
    sched = make(num_blocks=6, preemption=preemption)
    a, b = seq(8, max_new=8), seq(8, max_new=8, start=50)
    sched.add(a)
    sched.add(b)
    return sched, a, b


def step_until_preemption(sched, limit=20):
    for _ in range(limit):
        out, _ = step(sched)
        if out.preempted:
            return out
    raise AssertionError("no preemption")


def test_recompute_preempts_the_most_recently_admitted_and_it_resumes_from_the_prefix_cache():
    sched, a, b = two_growing("recompute")
    out = step_until_preemption(sched)
    assert out.preempted == [(b, "recompute")] and list(sched.waiting) == [b] and sched.running == [a]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert a.seq_id in work(out) and out.admitted == []
    assert sched.stats.preemptions["recompute"] == 1 and sched.stats.preempted_tokens["recompute"] == 12
    assert sched.bm.num_cached_free_blocks >= 2  # b's full blocks stay findable
    while b not in out.admitted:
        out, _ = step(sched)
    assert b.num_preemptions == 1 and b.num_cached_tokens == 8  # blocks 0, 1; a took block 2
    assert work(out)[b.seq_id] == (8, 5, True) and sched.stats.tokens_recomputed == 4
    run_all(sched)
    assert a.completion_token_ids == solo(range(8), 8) and b.completion_token_ids == solo(range(50, 58), 8)


def test_swap_pins_the_victims_kv_until_stored_then_restores_what_the_cache_lost():
    sched, a, b = two_growing("swap")
    bm = sched.bm
    out = step_until_preemption(sched)
    assert out.preempted == [(b, "swap")] and b.status is SequenceStatus.SWAPPED
    (swap,) = out.swapped_out
    assert swap.seq is b and swap.num_tokens == 12 and len(swap.block_ids) == 3
    assert all(bm.blocks[i].pins == 1 and bm.blocks[i].ref_count == 0 for i in swap.block_ids)
    assert out.stalled == [a] and out.is_empty  # a waits for the blocks being stored
    out, _ = step(sched)
    assert out.is_empty and out.stalled == [a]
    sched.release_pins(b)  # the engine stored the tail
    assert b.pinned_blocks == [] and bm.num_pinned_blocks == 0
    out, _ = step(sched)
    assert work(out) == {a.seq_id: (12, 1, True)}
    while a.status is not SequenceStatus.FINISHED:
        out, _ = step(sched)
        assert b.seq_id not in work(out)
    out, _ = step(sched)  # b comes back: its full blocks still cached, its partial last block to restore
    (restore,) = out.restores
    assert restore.seq is b and b.status is SequenceStatus.RESTORING and b.seq_id not in work(out)
    assert restore.first_token == b.num_cached_tokens and restore.num_tokens == 12
    assert restore.first_token + 4 * len(restore.block_indexes) >= 12
    assert all(bm.blocks[i].pins == 1 for i in restore.block_ids)
    step(sched)
    assert b.status is SequenceStatus.RESTORING
    sched.restore_done(b, 12)
    out, _ = step(sched)
    assert out.admitted == [b] and work(out) == {b.seq_id: (12, 1, True)}
    assert sched.stats.tokens_restored == 12 - restore.first_token and sched.stats.tokens_recomputed == 0
    run_all(sched)
    assert a.completion_token_ids == solo(range(8), 8) and b.completion_token_ids == solo(range(50, 58), 8)


def test_a_swapped_sequence_is_not_readmitted_while_its_blocks_are_being_stored():
    sched, a, b = two_growing("swap")
    step_until_preemption(sched)
    sched.abort(a)  # blocks enough for b now, but its tail is not on storage yet
    out, _ = step(sched)
    assert out.restores == [] and out.is_empty and b.status is SequenceStatus.SWAPPED
    sched.release_pins(b)
    out, _ = step(sched)  # its blocks were not reused meanwhile: all of its KV is found in the pool
    assert out.admitted == [b] and out.restores == [] and b.num_cached_tokens == 12
    assert sched.stats.tokens_restored == 0 and sched.stats.tokens_recomputed == 0
    run_all(sched)
    assert b.completion_token_ids == solo(range(50, 58), 8)


def test_a_lone_sequence_without_room_preempts_itself():
    sched = make(num_blocks=4)
    r = seq(5, max_new=1, start=200)
    assert sched.start_restore(r, 4) is not None  # holds 2 blocks while restoring
    a = seq(7, max_new=3)  # 2 blocks, a third at its second decode
    sched.add(a)
    out = step_until_preemption(sched)
    assert out.preempted == [(a, "recompute")] and sched.running == [] and list(sched.waiting) == [a]
    out, _ = step(sched)
    assert out.is_empty  # a needs 3 blocks, 2 are free: it waits for r
    sched.restore_done(r, 4)
    run_all(sched)
    assert a.completion_token_ids == solo(range(7), 3) and r.finish_reason == "length"


# -- restores of new sequences (the agent's prefetch)
def test_a_restoring_sequence_waits_outside_the_batch_while_others_decode():
    sched = make()
    a = seq(3, max_new=20)
    sched.add(a)
    step(sched)
    r = seq(10, max_new=3, start=40)
    req = sched.start_restore(r, 8)
    assert req.block_indexes == [0, 1] and (req.first_token, req.num_tokens) == (0, 8)
    assert r.status is SequenceStatus.RESTORING and sched.num_waiting == 1
    for _ in range(3):
        out, _ = step(sched)
        assert set(work(out)) == {a.seq_id}
    sched.restore_done(r, 8)
    out, _ = step(sched)
    assert out.admitted == [r] and work(out)[r.seq_id] == (8, 2, True) and a.seq_id in work(out)
    run_all(sched)
    assert r.completion_token_ids == solo(range(40, 50), 3)


def test_a_joined_restore_runs_with_its_blocks_pinned_and_out_of_the_prefix_cache_until_it_landed():
    sched = make()
    r = seq(10, max_new=3, start=40)
    req = sched.start_restore(r, 8)
    sched.restore_joined(r, 8)  # group 0 of both blocks landed: r runs while the rest lands
    assert r.num_computed_tokens == 8 and sched.num_waiting == 1 and not sched.restoring
    out, _ = step(sched)
    assert out.admitted == [r] and work(out)[r.seq_id] == (8, 2, True)
    twin = seq(10, max_new=1, start=40)  # the same prefix: must not share blocks still landing
    sched.add(twin)
    assert all(sched.bm.blocks[b].pins == 1 for b in req.block_ids)
    assert not any(sched.bm.blocks[b].hash for b in req.block_ids)
    step(sched)
    assert twin.num_cached_tokens == 0
    sched.restore_done(r, 8)  # every group landed: unpinned, and registered unless the twin's took the names
    assert all(sched.bm.blocks[b].pins == 0 for b in req.block_ids)
    assert set(sched.bm.hashes(r, 2)) <= set(sched.bm.hash_to_block)
    run_all(sched)
    assert r.completion_token_ids == solo(range(40, 50), 3)


@pytest.mark.parametrize("where", ["ready", "running"])
def test_an_unjoined_restore_leaves_the_batch_and_keeps_what_landed_when_it_ends(where):
    sched = make()
    r = seq(14, max_new=3, start=40)
    req = sched.start_restore(r, 12)
    sched.restore_joined(r, 12)
    if where == "running":
        out = sched.schedule()  # r is in this step; its output will not be used
        assert work(out)[r.seq_id] == (12, 2, True)
    sched.unjoin(r)
    assert r.status is SequenceStatus.RESTORING and r.num_computed_tokens == 0 and r not in sched.running
    if where == "running":
        assert sched.postprocess(out, [model(r)]) == [] and r.num_computed_tokens == 0 and len(r) == 14
    out, _ = step(sched)
    assert r.seq_id not in work(out)  # restoring again: outside the batch
    sched.restore_done(r, 4)  # block 1 failed: block 0 is kept, the rest prefilled
    assert all(sched.bm.blocks[b].pins == 0 for b in req.block_ids)
    out, _ = step(sched)
    assert work(out)[r.seq_id] == (4, 10, True)
    run_all(sched)
    assert r.completion_token_ids == solo(range(40, 54), 3)


def test_an_abort_during_a_restore_keeps_its_blocks_pinned_until_the_io_ends():
    sched = make(num_blocks=4)
    r = seq(9, max_new=2)
    req = sched.start_restore(r, 8)
    sched.abort(r)
    assert r.finish_reason == "abort" and sched.num_waiting == 0 and r.pinned_blocks == req.block_ids
    assert sched.bm.num_allocatable_blocks == 4 - 2
    sched.restore_done(r, 8)  # the GET landed: nobody else held those blocks meanwhile
    assert r.pinned_blocks == [] and sched.bm.num_allocatable_blocks == 4


def test_a_restore_needing_no_block_from_storage_is_ready_at_once():
    sched = make()
    a = seq(9, max_new=1)
    sched.add(a)
    step(sched)  # a's blocks 0, 1 are cached now
    r = seq(9, max_new=2)
    assert sched.start_restore(r, 8) is None and r.status is SequenceStatus.WAITING
    out, _ = step(sched)
    assert out.admitted == [r] and work(out)[r.seq_id] == (8, 1, True)


def test_a_restore_without_free_blocks_is_refused():
    sched = make(num_blocks=4)
    sched.add(seq(12, max_new=1))
    sched.schedule()
    assert sched.start_restore(seq(8, max_new=1, start=50), 8) is None


# -- limits and the end of a sequence
def test_the_wait_queue_is_bounded_and_a_sequence_too_large_for_the_pool_is_refused():
    sched = make(num_blocks=4, max_waiting=2)
    sched.add(seq(3))
    sched.add(seq(3))
    with pytest.raises(QueueFull, match="max_waiting 2"):
        sched.add(seq(3))
    too_big = seq(14, max_new=4)  # 17 tokens of KV: 5 blocks
    with pytest.raises(NeverFits, match="needs? 5 blocks .*the pool has 4"):
        sched.add(too_big)
    with pytest.raises(NeverFits):
        sched.start_restore(too_big, 8)


def test_sequences_finish_on_a_stop_token_or_at_max_new_tokens_and_free_their_blocks():
    sched = make(stop={7})
    a, b = seq(5, max_new=10), seq(5, max_new=3, start=20)
    sched.add(a)
    sched.add(b)
    finished = []
    for _ in range(5):
        _, done = step(sched, next_token=lambda s: 7 if s is a and len(s.completion_token_ids) == 1 else 3)
        finished += done
    assert finished == [a, b] and (a.finish_reason, b.finish_reason) == ("stop", "length")
    assert a.completion_token_ids == [3, 7] and b.completion_token_ids == [3, 3, 3]
    assert sched.bm.num_free_blocks == sched.bm.num_blocks and not sched.has_work()


def test_a_requests_own_stop_tokens_end_it_with_the_id_as_stop_reason_but_not_before_min_tokens():
    sched = make(stop={7})
    a = Sequence(list(range(5)), max_new_tokens=10, block_tokens=BT, stop_token_ids=frozenset({9}), min_tokens=3)
    b = Sequence(list(range(20, 25)), max_new_tokens=10, block_tokens=BT, ignore_eos=True,
                 stop_token_ids=frozenset({9}))
    sched.add(a)
    sched.add(b)
    script = {id(a): [9, 7, 9, 3], id(b): [7, 9]}
    finished = []
    for _ in range(5):
        _, done = step(sched, next_token=lambda s: script[id(s)][s.num_completion_tokens])
        finished += done
    assert finished == [b, a]
    assert (b.finish_reason, b.stop_reason, b.completion_token_ids) == ("stop", "9", [7, 9])  # eos ignored
    assert (a.finish_reason, a.stop_reason, a.completion_token_ids) == ("stop", "9", [9, 7, 9])
    assert not sched.has_work() and sched.bm.num_free_blocks == sched.bm.num_blocks


def test_a_running_sequence_stopped_after_postprocess_frees_or_pins_its_blocks_as_a_finish_does():
    for pin in (False, True):
        sched = make(pin_finished=pin)
        a, b = seq(9, max_new=10), seq(5, max_new=10, start=30)
        sched.add(a)
        sched.add(b)
        step(sched)
        sched.stop(a, "END")
        assert (a.status, a.finish_reason, a.stop_reason) == (SequenceStatus.FINISHED, "stop", "END")
        assert sched.running == [b] and len(a.pinned_blocks) == (3 if pin else 0)
        with pytest.raises(ValueError):
            sched.stop(a)
        out, _ = step(sched)
        assert [s.seq for s in out.scheduled] == [b]


def test_pin_finished_keeps_a_finished_sequences_kv_blocks_until_released():
    sched = make(pin_finished=True)
    a = seq(9, max_new=1)
    sched.add(a)
    _, done = step(sched)
    assert done == [a] and len(a.pinned_blocks) == 3 and sched.bm.num_pinned_free_blocks == 3
    sched.release_pins(a)
    assert sched.bm.num_allocatable_blocks == sched.bm.num_blocks


def test_an_abort_between_schedule_and_postprocess_drops_the_sequence():
    sched = make()
    a, b = seq(5, max_new=5), seq(5, max_new=5, start=30)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    sched.abort(a)
    finished = sched.postprocess(out, [1, 2])
    assert finished == [] and a.finish_reason == "abort" and a.completion_token_ids == []
    assert sched.running == [b] and b.completion_token_ids == [2]
    assert sched.bm.num_free_blocks == sched.bm.num_blocks - len(b.block_table)


# -- many sequences, a small pool, random lengths: run to completion and check every step
V, STOP = 50, 0


def kv_values(salt: bytes, tokens: list[int], have: list[int]) -> list[int]:
    """The fake "KV" of each position: a digest of the salt and every token up to it (extends have)."""
    for p in range(len(have), len(tokens)):
        have.append(hash((have[p - 1] if p else hash(salt), tokens[p])))
    return have


def truth(s: Sequence) -> list[int]:
    """The completion a correct engine gives: the fake model over the right KV, alone."""
    tokens, values = s.token_ids[:s.num_prompt_tokens], []
    while True:
        tokens.append(kv_values(s.salt, tokens, values)[-1] % V)
        if tokens[-1] == STOP or len(tokens) - s.num_prompt_tokens == s.max_new_tokens:
            return tokens[s.num_prompt_tokens:]


class FakeEngine:
    """Drives the scheduler as the engine will, with a pool of fake KV values and I/O that lands later.

    The model reads every position it attends to and checks it holds the right value, so a
    block shared across salts, reused while pinned or overwritten while shared shows up.
    """

    def __init__(self, sched: Scheduler, rng):
        self.sched, self.bm, self.rng = sched, sched.bm, rng
        self.pool = [[None] * BT for _ in range(self.bm.num_blocks)]
        self.values: dict[int, list[int]] = {}
        self.io: list[tuple[int, object]] = []  # (due step, callable)
        self.now = 0
        self.swap_ins = 0
        self.storage: dict[int, list[list]] = {}  # seq id -> its swapped-out blocks, once stored

    def expected(self, s: Sequence) -> list[int]:
        return kv_values(s.salt, s.token_ids, self.values.setdefault(s.seq_id, []))

    def later(self, fn, max_delay: int) -> None:
        self.io.append((self.now + self.rng.randint(0, max_delay), fn))

    def land_io(self) -> None:
        due = [fn for t, fn in self.io if t <= self.now]
        self.io = [(t, fn) for t, fn in self.io if t > self.now]
        for fn in due:
            fn()

    # the swap-out: the blocks' content goes to "storage"; they must not change until unpinned
    def swap_out(self, swap) -> None:
        saved = [list(self.pool[b]) for b in swap.block_ids]

        def stored():
            assert [self.pool[b] for b in swap.block_ids] == saved, "a pinned block was overwritten"
            self.storage[swap.seq.seq_id] = saved
            self.sched.release_pins(swap.seq, swap.block_ids)
        self.storage.pop(swap.seq.seq_id, None)
        self.later(stored, 2)

    def restore(self, req, source: str) -> None:
        s, ids = req.seq, req.block_ids
        assert all(self.bm.blocks[b].pins >= 1 for b in ids)
        assert source != "swap" or s.seq_id in self.storage, "a restore issued before its swap-out was stored"

        def landed():
            if s.is_finished:  # aborted meanwhile: the GET lands in blocks nobody may hold
                assert all(self.bm.blocks[b].ref_count == 0 and self.bm.blocks[b].pins for b in ids)
                self.sched.restore_done(s, req.num_tokens)  # releases the pins
                return
            covered = req.num_tokens
            if self.rng.random() < 0.2:  # a partial restore: the rest is prefilled
                covered = self.rng.randint(req.first_token, req.num_tokens)
            # storage holds the swapped-out blocks, or (prefetch) what a previous turn stored
            source_values = self.storage[s.seq_id] if source == "swap" else None
            exp = self.expected(s)
            for i, b in zip(req.block_indexes, ids):
                assert self.bm.blocks[b].ref_count == 1
                for off, p in enumerate(range(i * BT, (i + 1) * BT)):
                    good = source_values[i][off] if source_values else exp[p] if p < len(exp) else None
                    # past what landed, or past what was asked for: never the right KV
                    self.pool[b][off] = good if p < min(covered, req.num_tokens) else "lost"
            if covered == req.num_tokens:  # whole blocks landed: the manager keeps only what it asked for
                covered += self.rng.randint(0, BT)
            self.sched.restore_done(s, covered)
            self.swap_ins += source == "swap"
        self.later(landed, 3)

    def forward(self, out) -> list[int]:
        sampled = []
        for w in out.scheduled:
            s, exp = w.seq, self.expected(w.seq)
            for p in range(w.start):  # attention reads every earlier position
                assert self.pool[s.block_table[p // BT]][p % BT] == exp[p], f"wrong KV at {p} of {s.seq_id}"
            for p in range(w.start, w.start + w.num_tokens):
                block = self.bm.blocks[s.block_table[p // BT]]
                assert block.ref_count == 1 and block.pins == 0, "a write into a shared or pinned block"
                self.pool[block.block_id][p % BT] = exp[p]
            if w.samples:
                sampled.append(self.pool[s.block_table[(len(s) - 1) // BT]][(len(s) - 1) % BT] % V)
        return sampled

    def step(self) -> list[Sequence]:
        self.land_io()
        out = self.sched.schedule()
        for swap in out.swapped_out:
            self.swap_out(swap)
        for req in out.restores:
            self.restore(req, "swap")
        finished = self.sched.postprocess(out, self.forward(out))
        if self.sched.pin_finished:
            for s in finished:
                self.later(lambda s=s: self.sched.release_pins(s), 2)
        self.now += 1
        return finished


def check_invariants(sched: Scheduler, everyone: list[Sequence]) -> None:
    bm = sched.bm
    holders = sched.running + list(sched.ready) + list(sched.restoring.values())
    assert len(sched.running) <= sched.max_num_seqs
    assert len({id(s) for s in holders} | {id(s) for s in sched.waiting}) == len(holders) + len(sched.waiting)
    assert all(not s.block_table for s in sched.waiting) and all(s.status is SequenceStatus.RUNNING
                                                                 for s in sched.running)
    assert all(not s.block_table for s in everyone if s not in holders)
    owners: dict[int, list[tuple[Sequence, int]]] = {}
    for s in holders:
        # every token but a just-sampled one that starts a new block (it gets it at the next schedule)
        assert s.num_blocks - (len(s) % BT == 1) <= len(s.block_table) <= s.num_blocks
        assert s.num_cached_tokens <= s.num_computed_tokens < len(s)
        for i, b in enumerate(s.block_table):
            owners.setdefault(b, []).append((s, i))
    for block in bm.blocks:
        held = owners.get(block.block_id, [])
        assert block.ref_count == len(held), "ref count != block tables holding the block"
        if len(held) > 1:  # shared only by prefix: the same hash chain, same salt, computed
            assert block.hash is not None
            assert all(s.block_hashes[i] == block.hash and (i + 1) * BT <= s.num_computed_tokens for s, i in held)
    plain, cached, pinned = set(bm._plain), set(bm._cached), bm._pinned_free
    free = {b.block_id for b in bm.blocks if b.ref_count == 0}
    assert len(bm._plain) + len(cached) + len(pinned) == len(free) and plain | cached | pinned == free
    assert all(bm.blocks[b].pins for b in pinned) and not any(bm.blocks[b].pins for b in plain | cached)
    assert all(bm.blocks[b].hash == h for h, b in bm.hash_to_block.items())
    assert all(bm.hash_to_block.get(bm.blocks[b].hash) == b for b in cached)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(4))
def test_many_sequences_in_a_small_pool_all_finish_with_the_right_tokens(preemption, seed):
    import random
    rng = random.Random(seed)
    sched = make(num_blocks=14, max_num_seqs=6, budget=rng.choice([8, 16, 64]), preemption=preemption,
                 max_waiting=8, stop={STOP}, pin_finished=bool(seed % 2))
    engine = FakeEngine(sched, rng)
    systems = [[rng.randrange(1, V) for _ in range(rng.randint(4, 12))] for _ in range(3)]
    arrivals = []
    for n in range(40):
        prompt = rng.choice(systems + [[]]) + [rng.randrange(1, V) for _ in range(rng.randint(1, 14))]
        s = Sequence(prompt, max_new_tokens=rng.randint(1, 24), block_tokens=BT,
                     salt=rng.choice([b"tenant-a", b"tenant-b"]))
        arrivals.append((rng.randint(0, 60), s))
    arrivals.sort(key=lambda a: a[0])
    everyone = [s for _, s in arrivals]
    aborted, finished = set(), []
    while arrivals or sched.has_work() or engine.io:
        assert engine.now < 3000, "no progress"
        while arrivals and arrivals[0][0] <= engine.now:
            s = arrivals[0][1]
            try:
                req = sched.start_restore(s, rng.randint(1, len(s))) if rng.random() < 0.25 else None
                if req is not None:
                    engine.restore(req, "prefetch")
                elif not s.block_table:  # no blocks for a restore (with blocks: all found in the pool)
                    sched.add(s)
            except QueueFull:
                break  # it arrives again next step
            arrivals.pop(0)
        live = [s for s in everyone if s.status not in (SequenceStatus.FINISHED,) and s in
                sched.running + list(sched.waiting) + list(sched.restoring.values())]
        if live and rng.random() < 0.02:
            victim = rng.choice(live)
            sched.abort(victim)
            aborted.add(victim.seq_id)
        finished += engine.step()
        check_invariants(sched, everyone)
        assert all(sched.bm.blocks[b].pins for s in everyone for b in s.pinned_blocks)
    assert all(s.is_finished for s in everyone) and sched.bm.num_pinned_blocks == 0
    assert sched.bm.num_free_blocks == sched.bm.num_blocks
    for s in everyone:
        if s.seq_id not in aborted:
            assert s.completion_token_ids == truth(s), f"sequence {s.seq_id}"
    assert sched.stats.preemptions[preemption] > 0
    if preemption == "swap":
        assert engine.swap_ins > 0
    assert sched.bm.prefix_cache_hits > 0


# -- max_new_tokens holds no blocks ahead (issue 40: the OpenAI API's default is what the context leaves)
def batch_over_time(max_new: int, steps: int = 40) -> tuple[list[int], list[int]]:
    """(sequences running, blocks held) after each step of 48 turns of 100-token prompts, each asking for
    max_new tokens, on the compute node's defaults: 1,024 blocks of 32 tokens, 32 sequences, 512 tokens
    a step."""
    sched = Scheduler(BlockManager(1024, 32), 32, 512, "recompute", 256)
    for i in range(48):
        sched.add(Sequence(list(range(1000 * i + 1, 1000 * i + 101)), max_new_tokens=max_new, block_tokens=32,
                           salt=bytes([i])))
    running, held = [], []
    for _ in range(steps):
        step(sched)
        running.append(len(sched.running))
        held.append(sched.bm.num_blocks - sched.bm.num_free_blocks)
    return running, held


def test_a_large_max_new_tokens_batches_as_many_sequences_as_a_small_one():
    small = batch_over_time(256)
    large = batch_over_time(8192 - 100)  # the whole context's room: 253 blocks each, were they reserved
    assert large == small
    running, held = large
    assert max(running) == 32 and running[-1] == 32  # max_num_seqs, not the 4 that reserving would allow
    assert held[-1] == 32 * 5  # 100 prompt + 40 generated tokens: 5 blocks each, taken as tokens came


def test_a_reply_to_the_contexts_end_finishes_with_length():
    context, prompt = 64, 10
    sched = Scheduler(BlockManager(64, BT), 4, 64)
    s = Sequence(list(range(1, prompt + 1)), max_new_tokens=context - prompt, block_tokens=BT)
    sched.add(s)
    run_all(sched)
    assert (s.finish_reason, s.num_completion_tokens, len(s)) == ("length", context - prompt, context)
