"""The scheduler's fair share across users: admission, the prefill budget, preemption victims (pure)."""
from __future__ import annotations

from compute_node.block_manager import BlockManager
from compute_node.scheduler import Scheduler
from compute_node.sequence import Sequence

BT = 4


def make(num_blocks=64, max_num_seqs=4, budget=64, max_waiting=64, preemption="recompute"):
    return Scheduler(BlockManager(num_blocks, BT), max_num_seqs, budget, preemption, max_waiting)


def seq(user, n=6, max_new=3, start=0):
    return Sequence(list(range(start, start + n)), max_new_tokens=max_new, block_tokens=BT, user_id=user,
                    salt=user.encode())


def step(sched):
    out = sched.schedule()
    sched.postprocess(out, [7] * len(out.sampling))
    return out


def test_a_modest_users_turn_is_admitted_in_the_first_schedule_with_room_before_the_greedy_users_queue():
    sched = make(max_num_seqs=4)
    greedy = [seq("greedy", start=10 * i) for i in range(20)]
    for s in greedy:
        sched.add(s)
    modest = seq("modest", start=500)
    sched.add(modest)  # behind all twenty
    out = sched.schedule()
    assert modest in out.admitted  # FIFO would have admitted greedy[0:4] and left it 17th in line
    assert out.admitted == [greedy[0], modest, greedy[1], greedy[2]]


def test_a_newcomer_waits_only_for_room_not_for_the_greedy_users_queue():
    sched = make(max_num_seqs=2)
    greedy = [seq("greedy", max_new=2, start=10 * i) for i in range(20)]
    for s in greedy:
        sched.add(s)
    step(sched)  # greedy[0], greedy[1] run
    modest = seq("modest", start=500, max_new=2)
    sched.add(modest)
    admitted = []
    for _ in range(4):
        admitted += step(sched).admitted
        if modest in admitted:
            break
    assert modest in admitted and admitted.index(modest) == 0, admitted  # the first place that freed up


def test_each_users_own_order_is_kept():
    sched = make(max_num_seqs=2)
    a = [seq("a", start=10 * i) for i in range(6)]
    b = [seq("b", start=100 + 10 * i) for i in range(3)]
    for s in a[:4] + b + a[4:]:
        sched.add(s)
    admitted = []
    for _ in range(100):
        if not sched.has_work():
            break
        admitted += step(sched).admitted
    assert [s for s in admitted if s.user_id == "a"] == a
    assert [s for s in admitted if s.user_id == "b"] == b
    # alternating while both have waiting turns
    assert [s.user_id for s in admitted[:6]] == ["a", "b", "a", "b", "a", "b"]


def test_one_users_long_prompts_share_the_prefill_budget_with_anothers_turn():
    sched = make(num_blocks=256, max_num_seqs=8, budget=32)
    long = [seq("greedy", n=200, start=1000 * i) for i in range(3)]
    for s in long:
        sched.add(s)
    step(sched)  # the first long prompt takes the whole budget
    short = seq("modest", n=12, start=9000)
    sched.add(short)
    out = step(sched)
    work = {s.seq.seq_id: s.num_tokens for s in out.scheduled}
    assert short in out.admitted and work[short.seq_id] == 12, work  # admitted with a share of its own
    assert out.num_batched_tokens <= 32 and sum(work[s.seq_id] for s in long if s.seq_id in work) == 20


def test_the_victim_is_the_latest_sequence_of_the_user_with_the_most_running():
    # 8 blocks: greedy's three turns then modest's one, 2 blocks each (7 prompt tokens); greedy's next
    # decode crosses a block boundary and needs room: greedy gives it, though modest's turn came last
    sched = make(num_blocks=8, max_num_seqs=4, budget=64)
    greedy = [seq("greedy", n=7, max_new=8, start=100 * i) for i in range(3)]
    m = seq("modest", n=7, max_new=8, start=900)
    for s in greedy:
        sched.add(s)
    step(sched)
    sched.add(m)
    step(sched)
    assert sched.running == [*greedy, m] and sched.bm.num_allocatable_blocks == 0
    out = step(sched)
    assert [s for s, _ in out.preempted] == [greedy[2]] and m in sched.running
    assert {s.seq.seq_id for s in out.scheduled} == {greedy[0].seq_id, greedy[1].seq_id, m.seq_id}


def test_no_share_is_held_back_for_a_turn_that_cannot_be_admitted_yet():
    sched = make(num_blocks=56, max_num_seqs=8, budget=32)
    long = seq("greedy", n=200, start=1000)  # 50 blocks
    sched.add(long)
    step(sched)
    big = seq("modest", n=40, start=9000)  # 10 blocks: 6 are left
    sched.add(big)
    out = step(sched)
    assert big not in out.admitted and {s.seq.seq_id: s.num_tokens for s in out.scheduled} == {long.seq_id: 32}


def restored(sched, s, tokens=4):
    """s restored from storage (its first `tokens` tokens): it waits in the ready queue."""
    request = sched.start_restore(s, tokens)
    assert request is not None
    sched.restore_done(s, tokens)
    assert s in sched.ready


def test_restored_sequences_wait_for_their_users_turn_not_first_come():
    sched = make(num_blocks=256, max_num_seqs=2)
    greedy = [seq("greedy", start=10 * i) for i in range(6)]
    for s in greedy:
        restored(sched, s)
    modest = seq("modest", start=500)
    restored(sched, modest)  # behind six restored greedy sequences
    out = sched.schedule()
    assert out.admitted == [modest, greedy[0]]  # FIFO would have taken greedy[0] and greedy[1]


def test_a_waiting_newcomer_goes_before_a_greedy_users_restored_sequences():
    sched = make(num_blocks=256, max_num_seqs=1)
    greedy = [seq("greedy", start=10 * i, max_new=2) for i in range(4)]
    for s in greedy:
        restored(sched, s)
    step(sched)  # greedy[0] runs
    modest = seq("modest", start=500, max_new=2)
    sched.add(modest)  # waiting, no stored prefix
    admitted = []
    for _ in range(4):
        admitted += step(sched).admitted
    assert admitted[0] is modest, admitted


def greedy_batch(sched, n):
    """n greedy sequences running their decodes."""
    greedy = [seq("greedy", n=3, max_new=50, start=10 * i) for i in range(n)]
    for s in greedy:
        sched.add(s)
    step(sched)
    assert len(sched.running) == n and all(s.is_decode for s in greedy)
    return greedy


def test_beside_a_greedy_user_a_newcomer_takes_a_place_past_the_batch_and_a_first_token_step_of_its_own():
    sched = make(num_blocks=256, max_num_seqs=4, budget=64)
    sched.newcomer_slots, sched.first_token_steps = 1, True
    greedy = greedy_batch(sched, 4)
    modest = seq("modest", n=6, start=500)
    sched.add(modest)
    out = step(sched)
    assert out.admitted == [modest] and [s.seq for s in out.scheduled] == [modest]  # no decode beside it
    assert modest.num_completion_tokens == 1 and len(sched.running) == 5  # its first token, one place past
    out = step(sched)  # never two first-token steps in a row: every decode runs now
    assert {s.seq.seq_id for s in out.scheduled} == {s.seq_id for s in [*greedy, modest]}
    second = seq("other", n=6, start=700)
    sched.add(second)
    out = step(sched)  # the places past the batch are taken: it waits for a place like anyone
    assert second not in out.admitted and not any(s.seq is second for s in out.scheduled)


def test_without_a_greedy_user_prefills_and_decodes_share_every_step_as_before():
    sched = make(num_blocks=256, max_num_seqs=4, budget=64)
    sched.newcomer_slots, sched.first_token_steps = 1, True
    users = [seq(f"u{i}", n=3, max_new=50, start=10 * i) for i in range(3)]
    for s in users:
        sched.add(s)
    step(sched)
    newcomer = seq("new", n=6, start=500)
    sched.add(newcomer)
    out = step(sched)
    assert newcomer in out.admitted and len(out.scheduled) == 4  # three decodes beside its prompt
    late = seq("late", n=6, start=700)
    sched.add(late)
    assert late not in step(sched).admitted  # the batch of 4 is full: no place past it


# -- the step budget: a step of bounded length while another user waits (compute_node.step_budget)

TARGET_S = 0.1


def machine(runs):
    """The step time of a stand-in machine: a + b * tokens + c * kpairs seconds."""
    from compute_node.step_budget import features
    x = features(runs)
    return 0.01 + 0.001 * x[1] + 0.0002 * x[2]


def timed(budget=256, hold_s=0.5):
    """A scheduler with a step budget the 'engine' (timed_step) has fed a few varied steps already."""
    from compute_node.step_budget import StepBudget
    steps = StepBudget(TARGET_S, hold_s=hold_s)
    for start, n in ((0, 256), (256, 256), (1000, 40), (2000, 5), (64, 1), (3000, 120)):
        steps.observe([(start, n)], machine([(start, n)]))
    sched = Scheduler(BlockManager(2048, BT), 8, budget, "recompute", 64, step_budget=steps)
    return sched, steps


def timed_step(sched, steps):
    """One step as the engine runs it: schedule, the machine's time fed to the budget, postprocess."""
    out = sched.schedule()
    runs = [(s.start, s.num_tokens) for s in out.scheduled]
    if runs:
        steps.observe(runs, machine(runs))
    sched.postprocess(out, [7] * len(out.sampling))
    return out, machine(runs) if runs else 0.0


def test_alone_a_long_prompt_prefills_in_full_chunks_under_a_step_budget():
    sched, steps = timed(budget=256)
    long = seq("hog", n=2000, max_new=2, start=10_000)
    sched.add(long)
    chunks = [timed_step(sched, steps)[0].scheduled[0].num_tokens for _ in range(7)]
    assert chunks == [256] * 7  # each step ~0.9 s on this machine: no one else waits for it


def test_a_waiting_short_turn_gets_its_first_token_in_the_next_step_within_the_target():
    sched, steps = timed(budget=256)
    long = seq("hog", n=4000, max_new=2, start=10_000)
    sched.add(long)
    for _ in range(4):
        timed_step(sched, steps)  # full chunks alone: 1024 tokens in
    short = seq("victim", n=24, max_new=6, start=50_000)
    sched.add(short)
    out, took = timed_step(sched, steps)
    work = {s.seq.seq_id: s.num_tokens for s in out.scheduled}
    assert short.num_completion_tokens == 1 and work[short.seq_id] == 24  # its whole prompt, its first token
    assert took <= TARGET_S, took  # the step it waited for is within the target (in estimated step time)
    assert 0 < work[long.seq_id] < 256  # the long prompt goes on, in a chunk that leaves the short one time
    chunks = []
    while not short.is_finished:  # its decodes: each step within the target, the long prompt still moving
        out, took = timed_step(sched, steps)
        assert took <= TARGET_S * 1.001, took
        chunks.append({s.seq.seq_id: s.num_tokens for s in out.scheduled}.get(long.seq_id, 0))
    assert all(0 < c < 256 for c in chunks), chunks
    after = [timed_step(sched, steps) for _ in range(15)]
    chunks = [out.scheduled[0].num_tokens for out, _ in after]
    assert all(c < 256 for c in chunks[:5]), chunks  # its next turn may come: held, at half the target
    assert all(took <= TARGET_S / 2 * 1.001 for _, took in after[:5]), [t for _, t in after]
    assert chunks[-1] == 256 and chunks.count(256) >= 2, chunks  # after hold_s (0.5 s) of steps: full chunks


def test_two_long_prompts_beside_a_short_turn_take_the_steps_time_one_at_a_time():
    sched, steps = timed(budget=256)
    a, b = seq("hog", n=1500, max_new=2, start=10_000), seq("hog", n=1500, max_new=2, start=20_000)
    sched.add(a)
    sched.add(b)
    timed_step(sched, steps)
    short = seq("victim", n=16, max_new=4, start=50_000)
    sched.add(short)
    out, took = timed_step(sched, steps)
    assert short.num_completion_tokens == 1 and took <= TARGET_S
    out, took = timed_step(sched, steps)
    longs = [s for s in out.scheduled if s.seq in (a, b)]
    assert len(longs) == 1 and took <= TARGET_S * 1.001  # one long chunk: the other waits (max_num_partial_prefills 1)
