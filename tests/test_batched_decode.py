"""Batched decode across slots (src/serve/engine.c, seq_feed_step in src/models/model.h): the
engine decodes every generating slot in one forward call per step. Each conversation must come
out bit-identical to running it alone on a fresh engine — the same tokens, the same logprobs,
greedy or sampled — while the others join and leave the batch, and its slot's state must be
exactly what a lone run leaves (the next turn reuses it and still matches cold). The engine's
step log proves the batching fired, so a loop that silently went back to one slot per call fails.
"""
import re

from engine_client import Engine, cold

CTX = 256


def test_concurrent_slots_match_running_alone(cairn, family_model):
    model = family_model.model
    hi = family_model.ordinary_hi
    prompts = [[20 + (7 * i + 3 * k) % (hi - 20) for k in range(n)] for i, n in enumerate((9, 23, 5, 14))]
    # different lengths end the conversations at different steps, so the batch shrinks 4 -> 1;
    # two of them sample (seeded), so the sampler's draws are checked as well as the argmax
    params = [(7, 0.0), (12, 0.9), (4, 0.0), (10, 0.7)]
    e = Engine(cairn, model, "--ctx", str(CTX), "--slots", "4", "--kv-share", "0", env={"CAIRN_STEP_LOG": "1"})
    try:
        with e.one_write():          # the four SUBMITs reach the engine in one write
            reps = [e.submit("c%d" % i, ids=p, max_tokens=mt, slot=i, temperature=t)
                    for i, (p, (mt, t)) in enumerate(zip(prompts, params))]
        for i in range(4):
            e.collect("c%d" % i)
        # a second turn on slot 0 (greedy: its ids are the fed tokens) continues from the state
        # the batched steps left
        turn2 = prompts[0] + reps[0].fed() + [21, 22, 23]
        t2 = e.generate(turn2, 5, slot=0)
    finally:
        e.close()
    log = e.read_stderr()
    sizes = [int(k) for k in re.findall(r"step: (\d+) slots decoded in one forward call", log)]
    assert sizes and max(sizes) == 4, "no decode step batched all four slots:\n" + log[-2000:]
    assert 2 in sizes or 3 in sizes, "the batch never shrank as conversations ended"
    for i, (p, (mt, t)) in enumerate(zip(prompts, params)):
        alone = cold(cairn, model, ids=p, max_tokens=mt, temperature=t, args=("--ctx", str(CTX)))
        assert reps[i].error is None and alone.error is None
        assert (reps[i].ids, reps[i].lps, reps[i].text) == (alone.ids, alone.lps, alone.text), f"slot {i} differs"
        assert reps[i].completion == alone.completion
    assert t2.reuse == len(prompts[0]) + len(reps[0].fed())
    alone2 = cold(cairn, model, ids=turn2, max_tokens=5, args=("--ctx", str(CTX)))
    assert (t2.ids, t2.lps) == (alone2.ids, alone2.lps)


STEP = re.compile(r"step: (\d+) slots decoded in one forward call, weight bytes streamed: dense (\d+) routed (\d+)")


def test_batched_step_reads_the_weights_once(cairn, family_model):
    """A decode step of four conversations streams exactly the dense weight bytes (every checkpoint
    matrix but the routed experts, counted by the kernels: kernels_streamed) of a one-conversation
    step, not four times them: projections, head and every other weight are read once per pass.
    Routed experts are counted apart (four tokens choose more of them). A step that ran the
    sequences one by one, or any weight product left per sequence, reads more and fails here."""
    model = family_model.model
    hi = family_model.ordinary_hi
    prompts = [[20 + (11 * i + 5 * k) % (hi - 20) for k in range(6 + i)] for i in range(4)]
    e = Engine(cairn, model, "--ctx", str(CTX), "--slots", "4", "--kv-share", "0", env={"CAIRN_STEP_LOG": "1"})
    try:
        alone = e.generate(prompts[0], 8, slot=0)
        with e.one_write():
            for i, p in enumerate(prompts):
                e.submit("w%d" % i, ids=p, max_tokens=6, slot=i)
        reps = [e.collect("w%d" % i) for i in range(4)]
    finally:
        e.close()
    assert alone.error is None and all(r.error is None for r in reps)
    steps = [tuple(map(int, m)) for m in STEP.findall(e.read_stderr())]
    one = {dense for k, dense, _ in steps if k == 1}
    four = [(dense, routed) for k, dense, routed in steps if k == 4]
    assert one and four, f"no one- and four-slot steps: {steps}"
    assert len(one) == 1 and min(one) > 0, f"a one-slot step's dense bytes vary: {sorted(one)}"
    assert all(dense == min(one) for dense, _ in four), f"four-slot steps read {four}, one-slot {sorted(one)}"


STEP_JOBS = re.compile(r"step pool jobs: (\d+)\nstep: (\d+) slots decoded in one forward call")


def test_batched_deepseek_v4_step_synchronises_once_per_layer(cairn, tiny_dsv4):
    """A DeepSeek V4 decode step's pool jobs (synchronisations of every thread, counted by the
    pool) do not grow with the conversations it carries: its attention runs one sequence per pool
    task, one job per layer (deepseek_v4_attn.c attend_tokens), where attention run row by row
    took a job or more per row and layer (on the tiny model 90 / 94 / 98 jobs for steps of 2 / 3 /
    4 conversations, against 86 for each now). The batch shrinks 4 -> 3 -> 2 as conversations end.
    Two threads, so the pool is used."""
    prompts = [[20 + (11 * i + 5 * k) % 200 for k in range(6 + i)] for i in range(4)]
    e = Engine(cairn, tiny_dsv4, "--ctx", str(CTX), "--slots", "4", "--kv-share", "0", "--threads", "2",
               env={"CAIRN_STEP_LOG": "1"})
    try:
        with e.one_write():
            for i, p in enumerate(prompts):
                e.submit("j%d" % i, ids=p, max_tokens=(9, 3, 6, 12)[i], slot=i)
        reps = [e.collect("j%d" % i) for i in range(4)]
    finally:
        e.close()
    assert all(r.error is None for r in reps)
    steps = [(int(k), int(jobs)) for jobs, k in STEP_JOBS.findall(e.read_stderr())]
    by_size = {k: {jobs for size, jobs in steps if size == k} for k in (2, 3, 4)}
    assert all(by_size.values()) and min(by_size[2]) > 0, f"no 2-, 3- and 4-slot steps using the pool: {steps}"
    assert max(by_size[4]) <= min(by_size[2]), f"pool jobs grew with the slots of a step: {steps}"
