"""MTP speculative decoding (model.h seq_spec_step) on every family that drafts, each test run on
the tiny GLM-5 checkpoint (the MTP layer in src/models/glm_forward.c: a rows-only state that
truncates) and the tiny DeepSeek V4 one (the MTP block in src/models/deepseek_v4_mtp.c: window
rings and compressor partials, so rejected drafts leave through state_rewind's captures), through
tests/c/tool_spec:
  - the MTP draft log-probs agree with the independent float64 reference (tools/ref/glm.py
    mtp_forward, tools/ref/deepseek_v4.py mtp_run), past index_topk and past the window, so the MTP
    layer's own indexer selection (GLM) and its wrapped window ring (DeepSeek V4) are covered;
  - greedy speculative output is bit-identical to plain greedy decoding;
  - sampled speculative output is deterministic per seed, and the acceptance path fires (high
    temperature makes draft and target distributions overlap, so drafts are kept);
  - after speculative decoding the record is exactly the emitted tokens and every state part is
    byte-identical to a cold sequence fed the same ids, whatever was drafted and rejected (the
    DeepSeek V4 runs reject drafts after the rings wrapped, where only a restored capture is exact);
  - `cairn run --spec mtp --draft K` prints exactly what plain greedy decoding prints, also with the
    routed experts (the MTP layer's too) read through a two-expert --expert-cache-mb budget, and
    refuses a checkpoint without an MTP layer it can draft with;
  - `cairn engine --spec mtp --draft K` says draft=K in CAPS, and every reply (greedy: ids, text,
    logprobs; sampled at a seed; two turns on one slot, so the second reuses the state speculative
    steps left) is what an engine without speculation sends; a sampled reply is the same at the same
    seed run to run."""
import json
import re
import os
import subprocess
import sys

import pytest
from engine_client import Engine, cold

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
import deepseek_v4 as ref_dsv4  # noqa: E402
import glm as ref  # noqa: E402

TOOL = os.path.join(ROOT, "build", "tests", "tool_spec")
BASE = 960
LONG = [BASE + 2, BASE + 4, BASE + 7] + [(37 * i + 11) % 950 for i in range(36)] + [BASE + 8, BASE + 21]
SHORT = [BASE + 2, BASE + 4, BASE + 7, 72, 105, 300, 400]


@pytest.fixture(scope="module", params=["glm", "deepseek_v4"])
def mtp_model(request):
    """(family, tiny checkpoint) of every family whose MTP layer drafts."""
    return request.param, request.getfixturevalue({"glm": "tiny_glm", "deepseek_v4": "tiny_dsv4"}[request.param])


def draft_reference(family, model, ids):
    """Reference draft log-probs [len(ids) - 1][vocab] in exact numerics."""
    if family == "glm":
        cfg, w = ref.load(model)
        assert len(ids) - 1 > cfg["index_topk"], "prompt too short to reach the MTP indexer"
        return ref.log_softmax(ref.mtp_forward(cfg, w, ids))
    with open(os.path.join(model, "config.json")) as f:
        assert len(ids) - 1 > json.load(f)["sliding_window"], "prompt too short to wrap the MTP block's ring"
    return [ref_dsv4.log_softmax(row) for row in ref_dsv4.mtp_run(model, ids)]


def spec(model, temperature, seed, k, n, ids):
    r = subprocess.run([TOOL, model, str(temperature), str(seed), str(k), str(n), ",".join(map(str, ids))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_exact_state(out, n):
    assert len(out["spec"]) == n
    assert out["record_ok"] == 1, "the record is not the prompt + the emitted tokens"
    assert out["state_equal"] == 1, "state parts differ from a cold sequence fed the same ids"
    assert out["logits_equal"] == 1, "the last verify row differs from the cold sequence's logits"


def test_draft_logits_match_reference(mtp_model):
    family, model = mtp_model
    r = subprocess.run([TOOL, model, "draft", ",".join(map(str, LONG))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    want = draft_reference(family, model, LONG)
    assert [row["pos"] for row in rows] == list(range(len(LONG) - 1))
    for row, lp in zip(rows, want):
        best = ref.top_indices(lp, 6)
        assert row["top"][0][0] == best[0], f"MTP pos {row['pos']}: top-1 {row['top'][0][0]} != {best[0]}"
        for tid, val in row["top"]:
            assert abs(val - lp[tid]) <= 0.002, f"MTP pos {row['pos']} id {tid}: {val} vs reference {lp[tid]}"


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_is_bit_identical(mtp_model, k):
    out = spec(mtp_model[1], 0, 1, k, 20, LONG)
    assert out["spec"] == out["plain"]
    assert out["drafted"] > 0 and out["steps"] > 0
    assert_exact_state(out, 20)


def test_sampled_is_deterministic_per_seed(mtp_model):
    model = mtp_model[1]
    a = spec(model, 0.8, 7, 3, 20, SHORT)
    b = spec(model, 0.8, 7, 3, 20, SHORT)
    c = spec(model, 0.8, 8, 3, 20, SHORT)
    assert a == b
    assert c["spec"] != a["spec"], "a different seed gave the same tokens: the sampler is not in the loop"
    for out in (a, c):
        assert_exact_state(out, 20)


@pytest.mark.parametrize("k", [2, 4])
def test_accepted_drafts_keep_the_state_exact(mtp_model, k):
    out = spec(mtp_model[1], 50, 3, k, 24, LONG)
    assert out["accepted"] > 0, "no draft was ever kept: the acceptance path did not run"
    assert out["accepted"] < out["drafted"] or out["steps"] > 1
    assert_exact_state(out, 24)


def run(cairn, model, *extra, ids=SHORT):
    return subprocess.run([cairn, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "24",
                           "--temperature", "0", "--format", "jsonl", "--top-logprobs", "3", "--ignore-eos", *extra],
                          capture_output=True, text=True)


@pytest.mark.parametrize("k", ["1", "4"])
def test_run_spec_greedy_prints_what_plain_prints(cairn, mtp_model, k):
    model = mtp_model[1]
    plain, fast = run(cairn, model), run(cairn, model, "--spec", "mtp", "--draft", k)
    assert plain.returncode == 0 and fast.returncode == 0, plain.stderr + fast.stderr
    assert len(plain.stdout.splitlines()) == 24
    assert fast.stdout == plain.stdout


def test_run_spec_long_prompt_with_every_logit(cairn, mtp_model):
    """A prompt over one internal pass (256 rows) in one forward call, with every position's logits:
    the head's rows and the MTP rows of one pass share the scratch, and the output is plain
    decoding's."""
    ids = [(53 * i + 7) % 950 for i in range(300)]
    model = mtp_model[1]
    one_call = ("--echo-logprobs", "3", "--prefill-chunks", "300")
    plain = run(cairn, model, *one_call, ids=ids)
    fast = run(cairn, model, *one_call, "--spec", "mtp", "--draft", "2", ids=ids)
    assert plain.returncode == 0 and fast.returncode == 0, plain.stderr + fast.stderr
    assert len(plain.stdout.splitlines()) == 300 + 24
    assert fast.stdout == plain.stdout


def test_run_spec_refusals(cairn, tiny_glm, tiny_kimi_k3):
    r = run(cairn, tiny_kimi_k3, "--spec", "mtp")
    assert r.returncode == 1 and "no MTP layer" in r.stderr
    r = run(cairn, tiny_glm, "--draft", "2")
    assert r.returncode == 2 and "--draft needs --spec mtp" in r.stderr
    r = run(cairn, tiny_glm, "--spec", "eagle")
    assert r.returncode == 2 and "--spec" in r.stderr


def engine_turns(cairn, model, *args, log=None):
    """Three requests: greedy with logprobs, sampled at a seed, and a second greedy turn on slot 0
    extending the first one's record (ids, text, logprobs and DONE counts of each)."""
    e = Engine(cairn, model, "--ctx", "256", "--slots", "2", *args, env={"CAIRN_STEP_LOG": "1"})
    try:
        a = e.generate(SHORT, 16, slot=0)
        b = e.generate(LONG, 12, slot=1, temperature=0.9, extra=" seed=11")
        c = e.generate(SHORT + a.fed() + [31, 32, 33], 10, slot=0)
        hot = e.generate(LONG[:20], 13, slot=1, temperature=50, extra=" seed=5")     # drafts get kept
        after = e.generate(LONG[:20] + [40, 41], 9, slot=1)
    finally:
        e.close()
    assert hot.completion == 13, "kept drafts ran past max_tokens"
    if log is not None:
        log.extend((int(k), int(n)) for k, n in re.findall(r"spec: slot \d+ kept (\d+) of (\d+) drafts", e.read_stderr()))
    return e.caps, [(r.ids, r.text, r.lps, r.done[3], r.done[7:10]) for r in (a, b, c, hot, after)]


def test_engine_spec_replies_equal_plain(cairn, mtp_model):
    model = mtp_model[1]
    caps, plain = engine_turns(cairn, model)
    steps = []
    spec_caps, spec = engine_turns(cairn, model, "--spec", "mtp", "--draft", "3", log=steps)
    _, again = engine_turns(cairn, model, "--spec", "mtp", "--draft", "3")
    assert " draft=0" in caps and " draft=3" in spec_caps, (caps, spec_caps)
    assert plain[0][0] and len(plain[0][0]) == 16
    assert [spec[i] for i in (0, 2, 4)] == [plain[i] for i in (0, 2, 4)], "greedy replies differ with speculation"
    assert again == spec, "sampled speculative decoding is not deterministic per seed"
    assert steps and all(n >= 1 for _, n in steps), "the engine took no speculative step"
    assert any(k > 0 for k, _ in steps), "no draft was ever kept: the acceptance path did not run"


def test_engine_spec_refuses_a_model_without_mtp(cairn, tiny_kimi_k3):
    r = subprocess.run([cairn, "engine", "-m", tiny_kimi_k3, "--spec", "mtp"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "no MTP layer" in r.stderr


def test_engine_speculating_slots_share_one_forward_call(cairn, mtp_model):
    """Three slots decode at once with --spec mtp: every step verifies each slot's next token and
    drafts in ONE forward call beside the others (the step log shows the batch and each slot's
    kept drafts inside it), and each reply is what a lone engine sends (greedy: what an engine
    without speculation sends)."""
    prompts = [LONG, SHORT, LONG[:20] + [40, 41]]
    params = [(14, 0.0, ""), (9, 0.0, ""), (12, 50.0, " seed=5")]      # the hot one keeps drafts
    spec_args = ("--ctx", "256", "--spec", "mtp", "--draft", "2")
    model = mtp_model[1]
    e = Engine(cairn, model, "--slots", "3", "--kv-share", "0", *spec_args, env={"CAIRN_STEP_LOG": "1"})
    try:
        with e.one_write():          # the three SUBMITs reach the engine in one write
            reps = [e.submit("s%d" % i, ids=p, max_tokens=mt, slot=i, temperature=t, extra=x)
                    for i, (p, (mt, t, x)) in enumerate(zip(prompts, params))]
        for i in range(3):
            e.collect("s%d" % i)
    finally:
        e.close()
    lines = e.read_stderr().splitlines()
    shared = [i for i, line in enumerate(lines) if line.startswith("step: 3 slots decoded in one forward call,")
              and len({l.split()[2] for l in lines[i + 1:i + 4] if l.startswith("spec: slot ")}) == 3]
    assert shared, "no step verified all three slots' drafts in one forward call:\n" + "\n".join(lines[-40:])
    assert any(int(m) > 0 for m in re.findall(r"spec: slot 2 kept (\d+)", "\n".join(lines))), "no draft kept"
    for i, (p, (mt, t, x)) in enumerate(zip(prompts, params)):
        alone = cold(cairn, model, ids=p, max_tokens=mt, temperature=t, extra=x, args=spec_args)
        assert reps[i].error is None and alone.error is None
        assert (reps[i].ids, reps[i].lps, reps[i].text) == (alone.ids, alone.lps, alone.text), f"slot {i} differs"
        if t == 0:
            plain = cold(cairn, model, ids=p, max_tokens=mt, args=("--ctx", "256"))
            assert (reps[i].ids, reps[i].lps) == (plain.ids, plain.lps), f"slot {i} differs from plain decoding"


def test_engine_speculating_slot_shares_its_calls_with_a_prefill(cairn, mtp_model):
    """A slot speculates (next + drafts verified per step) while another slot's 700-token prompt
    is prefilled in the same forward calls (engine.c joint_step): the step log shows calls that
    carry both the verify rows and prefill rows, and both replies are what lone engines send."""
    long = [(31 * i + 17) % 950 for i in range(700)]
    spec_args = ("--ctx", "1024", "--spec", "mtp", "--draft", "2")
    model = mtp_model[1]
    e = Engine(cairn, model, "--slots", "2", "--kv-share", "0", *spec_args, env={"CAIRN_STEP_LOG": "1"})
    try:
        with e.one_write():
            dec = e.submit("s", ids=LONG, max_tokens=30, slot=0, temperature=50.0, extra=" seed=5")
            pre = e.submit("p", ids=long, max_tokens=6, slot=1)
        e.collect("s")
        e.collect("p")
    finally:
        e.close()
    lines = e.read_stderr().splitlines()
    joint = [i for i, line in enumerate(lines)
             if re.match(r"step: 1 slots decoded in one forward call, .*; prefill rows [1-9]\d* of 1 requests$", line)
             and i + 1 < len(lines) and lines[i + 1].startswith("spec: slot 0 kept ")]
    assert joint, "no call verified a speculative step beside prefill rows:\n" + "\n".join(lines[-40:])
    for rep, ids, mt, extra in ((dec, LONG, 30, dict(temperature=50.0, extra=" seed=5")), (pre, long, 6, {})):
        alone = cold(cairn, model, ids=ids, max_tokens=mt, args=spec_args, **extra)
        assert rep.error is None and alone.error is None
        assert (rep.ids, rep.lps, rep.text) == (alone.ids, alone.lps, alone.text), f"{rep.rid} differs"


def test_bench_mtp_reports_costs_timed_in_its_decode(cairn, mtp_model):
    r = subprocess.run([cairn, "bench", "mtp", "-m", mtp_model[1], "--prompt", "8", "--decode", "8", "--draft", "3",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["draft"] == 3 and 0 <= b["mtp_acceptance"] <= 1
    for key in ("mtp_verify_cost_ratio", "mtp_draft_cost_ratio", "decode_tok_s", "spec_tok_s",
                "projected_speedup_at_0_8"):
        assert b[key] > 0, key
    assert b["mtp_other_cost_ratio"] >= 0


def test_run_spec_through_the_expert_cache(cairn, mtp_model):
    """--spec mtp with routed experts read through a budget of two experts (src/core/experts.h),
    so verify and draft passes evict each other's experts: greedy output is plain mapped decoding's,
    and the cache counters show it evicted and read."""
    from test_expert_cache import largest_expert, mb, stats
    model = mtp_model[1]
    budget = mb(2 * largest_expert(cairn, model))
    plain = run(cairn, model)
    for k in ("1", "3"):
        fast = run(cairn, model, "--spec", "mtp", "--draft", k, "--expert-cache-mb", budget)
        assert plain.returncode == 0 and fast.returncode == 0, plain.stderr + fast.stderr
        assert fast.stdout == plain.stdout, f"draft {k}"
        s = stats(fast.stderr)
        assert s["evictions"] > 0 and s["misses"] > 0 and s["read_errors"] == 0, s
