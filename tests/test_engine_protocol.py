"""`cairn engine` over the line protocol on the tiny DeepSeek V4 (an extend-only family: its window
ring and compressor state cannot rewind, so everything beyond a strict extension needs a checkpoint).

Every warm answer is compared token for token with a freshly started engine (cold), and every
reuse is asserted by its exact DONE count, so an optimisation that silently never fires fails.
"""
import json
import os
import random
import subprocess

import pytest

from engine_client import Engine, cold

CTX = 256


@pytest.fixture
def spawn(cairn, tiny_dsv4):
    started = []

    def start(*args, env=None):
        e = Engine(cairn, tiny_dsv4, "--ctx", str(CTX), *args, env=env)
        started.append(e)
        return e

    yield start
    for e in started:
        e.kill()


@pytest.fixture(scope="module")
def special(tiny_dsv4):
    added = json.load(open(os.path.join(tiny_dsv4, "tokenizer.json")))["added_tokens"]
    ids = {a["content"]: a["id"] for a in added}
    return {"bos": ids["<｜begin▁of▁sentence｜>"], "user": ids["<｜User｜>"], "assistant": ids["<｜Assistant｜>"]}


def words(seed, n):
    """Ordinary (non-special) token ids, deterministic per seed."""
    r = random.Random(seed)
    return [r.randrange(20, 1000) for _ in range(n)]


def reference(cairn, tiny_dsv4, ids, max_tokens, **kw):
    return cold(cairn, tiny_dsv4, ids=ids, max_tokens=max_tokens, args=("--ctx", str(CTX)), **kw)


def test_handshake(spawn):
    e = spawn()
    assert e.banner.endswith(b"\x01\x01READY\x01\x01\n")
    assert e.caps.startswith("CAPS ") and "slots=1" in e.caps.split() and f"ctx={CTX}" in e.caps.split()
    stat = e.stat.split()
    assert stat[0] == "STAT" and len(stat) >= 5
    assert e.close() == 0


def test_second_turn_reuses_and_matches_cold(spawn, cairn, tiny_dsv4):
    e = spawn()
    prompt = words(1, 12)
    t1 = e.generate(prompt, 6)
    assert t1.reuse == 0 and t1.accept == len(prompt) and t1.prompt_tokens == len(prompt)
    assert len(t1.ids) == t1.completion > 0
    turn2 = prompt + t1.ids + words(2, 5)
    t2 = e.generate(turn2, 6)
    assert t2.reuse == len(prompt) + len(t1.fed())
    ref = reference(cairn, tiny_dsv4, turn2, 6)
    assert ref.reuse == 0 and t2.ids == ref.ids and t2.text == ref.text


def test_identical_prompt_hits_the_checkpoint(spawn, cairn, tiny_dsv4):
    e = spawn()
    prompt = words(3, 20)
    t1 = e.generate(prompt, 5)
    t2 = e.generate(prompt, 5)
    # upstream re-prefills here; cairn restores the checkpoint taken after the last-but-one token
    assert t2.reuse == len(prompt) - 1
    assert t2.ids == t1.ids == reference(cairn, tiny_dsv4, prompt, 5).ids


def test_divergent_prompt_resets_and_matches_cold(spawn, cairn, tiny_dsv4):
    e = spawn()
    prompt = words(4, 16)
    e.generate(prompt, 4)
    shifted = [i + 1 for i in prompt]
    t = e.generate(shifted, 4)
    assert t.reuse == 0
    assert t.ids == reference(cairn, tiny_dsv4, shifted, 4).ids


def chat(special, *turns):
    """[bos] user-turn assistant-turn ... ; each turn is a list of ids."""
    out = [special["bos"]]
    for i, t in enumerate(turns):
        out += [special["user"] if i % 2 == 0 else special["assistant"]] + t
    return out


def test_regenerate_reuses_all_but_the_last_token(spawn, cairn, tiny_dsv4, special):
    e = spawn()
    prompt = chat(special, words(5, 10)) + [special["assistant"]]
    first = e.generate(prompt, 6)
    again = e.generate(prompt, 6)
    assert again.reuse == len(prompt) - 1
    assert again.ids == first.ids == reference(cairn, tiny_dsv4, prompt, 6).ids


def test_edit_last_user_message_restores_the_turn_boundary(spawn, cairn, tiny_dsv4, special):
    e = spawn()
    p1 = chat(special, words(6, 9)) + [special["assistant"]]
    r1 = e.generate(p1, 5)
    history = p1 + r1.ids
    # the turn boundary is the new user marker at len(history); one token past the start of that
    # turn's feed (len(history) - 1, the unfed last reply token), so the checkpoint is taken there
    boundary = len(history) - 1
    p2 = history + [special["user"]] + words(7, 8) + [special["assistant"]]
    e.generate(p2, 5)
    edited = history + [special["user"]] + words(8, 11) + [special["assistant"]]
    t = e.generate(edited, 5)
    assert t.reuse == boundary
    assert t.ids == reference(cairn, tiny_dsv4, edited, 5).ids


def test_ten_turn_conversation_reuse_grows(spawn, cairn, tiny_dsv4, special):
    e = spawn()
    prompt = chat(special, words(9, 6)) + [special["assistant"]]
    reuses = []
    for turn in range(10):
        t = e.generate(prompt, 3)
        if turn:
            assert t.reuse == expect, f"turn {turn}"
        reuses.append(t.reuse)
        expect = len(prompt) + len(t.fed())
        prompt = prompt + t.ids + [special["user"]] + words(100 + turn, 4) + [special["assistant"]]
    assert all(b > a for a, b in zip(reuses, reuses[1:])), reuses
    assert len(prompt) < CTX
    last = e.generate(prompt, 3)
    assert last.reuse == expect
    assert last.ids == reference(cairn, tiny_dsv4, prompt, 3).ids


def test_cancel_mid_decode_then_next_turn_is_exact(spawn, cairn, tiny_dsv4):
    e = spawn()
    prompt = words(10, 10)
    rep = e.submit("c1", ids=prompt, max_tokens=200)
    while not rep.ids:
        e.pump()
    e.send(b"CANCEL c1\n")
    e.collect("c1")
    assert rep.error == "CANCELLED" and rep.done is None
    turn2 = prompt + rep.ids + words(11, 4)
    t = e.generate(turn2, 4)
    assert t.reuse == len(prompt) + len(rep.fed(stopped=True))
    assert t.ids == reference(cairn, tiny_dsv4, turn2, 4).ids
    e.send(b"CANCEL c1\n")
    f, _ = e.pump()
    assert f == ["ERROR", "c1", "NOT_FOUND"]


def test_stop_ends_through_done_and_keeps_state(spawn, cairn, tiny_dsv4):
    e = spawn()
    prompt = words(12, 10)
    rep = e.submit("s1", ids=prompt, max_tokens=200)
    while not rep.ids:
        e.pump()
    e.send(b"STOP s1\n")
    e.collect("s1")
    assert rep.done is not None and not rep.length_limited and rep.completion == len(rep.ids) < 200
    turn2 = prompt + rep.ids + words(13, 4)
    t = e.generate(turn2, 4)
    assert t.reuse == len(prompt) + len(rep.fed(stopped=True))
    assert t.ids == reference(cairn, tiny_dsv4, turn2, 4).ids


def test_every_error_code(spawn):
    e = spawn("--slots", "2")
    e.send(b"SUBMIT bf 0 2 1 0 1\nhiX")              # terminator is not a newline
    f, _ = e.pump()
    assert f[:3] == ["ERROR", "bf", "BAD_FRAME"]
    e.send(b"SUBMIT br 0 2 1 nan 1\nhi\n")
    f, _ = e.pump()
    assert f[:3] == ["ERROR", "br", "BAD_REQUEST"]
    e.send(b"SUBMIT bs 5 2 1 0 1\nhi\n")            # slot out of range
    f, _ = e.pump()
    assert f[:3] == ["ERROR", "bs", "BAD_REQUEST"]
    e.send(b"SUBMIT gr 0 2 1 0 1 4\nhiroot\n")     # a grammar payload this engine cannot honour
    f, _ = e.pump()
    assert f[:3] == ["ERROR", "gr", "BAD_REQUEST"]
    e.send(b"SUBMIT em 0 0 1 0 1\n\n")
    f, _ = e.pump()
    assert f == ["ERROR", "em", "EMPTY_PROMPT"]
    e.send(b"CANCEL nobody\n")
    f, _ = e.pump()
    assert f == ["ERROR", "nobody", "NOT_FOUND"]
    e.send(b"STOP nobody\n")
    f, _ = e.pump()
    assert f == ["ERROR", "nobody", "NOT_FOUND"]
    long = words(14, CTX + 3)
    t = e.generate(long, 2)
    assert t.error == f"CONTEXT_EXCEEDED {CTX + 3} {CTX}" and t.accept is None
    busy = e.submit("busy", ids=words(15, 8), max_tokens=200)
    e.submit("clash", ids=words(16, 8), max_tokens=2, slot=0)
    assert e.collect("clash").error == "SLOT_BUSY"
    body = b"1 2 3"
    e.send(b"SUBMIT busy 1 %d 2 0 1 0 ids=1\n%s\n" % (len(body), body))
    while True:                                      # the duplicate's ERROR, not the original's frames
        f, data = e.frame()
        if f[:3] == ["ERROR", "busy", "DUPLICATE_ID"]:
            break
        e.route(f, data)
    e.send(b"CANCEL busy\n")
    assert e.collect("busy").error == "CANCELLED"
    bad = e.generate(ids=[5, 99999], max_tokens=1)
    assert bad.error.startswith("BAD_REQUEST")
    assert e.close() == 0


def test_failed_turn_taints_and_next_turn_is_exact(spawn, cairn, tiny_dsv4):
    e = spawn()
    prompt = words(18, 12)
    t1 = e.generate(prompt, 4)
    failed = e.generate(prompt + t1.ids + words(19, CTX), 4)
    assert failed.error.startswith("CONTEXT_EXCEEDED")
    turn2 = prompt + t1.ids + words(20, 5)
    t2 = e.generate(turn2, 4)
    assert t2.reuse == 0                           # the slot was tainted: re-prefilled
    assert t2.ids == reference(cairn, tiny_dsv4, turn2, 4).ids
    t3 = e.generate(turn2 + t2.ids + words(21, 3), 4)
    assert t3.reuse == len(turn2) + len(t2.fed())  # and reuse works again afterwards


def test_slots_are_independent(spawn, cairn, tiny_dsv4):
    e = spawn("--slots", "2", "--kv-share", "0")
    a, b = words(22, 14), words(23, 9)
    ra = e.submit("a", ids=a, max_tokens=6, slot=0)
    rb = e.submit("b", ids=b, max_tokens=6, slot=1)
    e.collect("a")
    e.collect("b")
    assert ra.ids == reference(cairn, tiny_dsv4, a, 6).ids
    assert rb.ids == reference(cairn, tiny_dsv4, b, 6).ids
    bad = e.generate(words(24, CTX + 1), 2, slot=1)   # slot 1 fails ...
    assert bad.error.startswith("CONTEXT_EXCEEDED")
    a2 = a + ra.ids + words(25, 3)
    t = e.generate(a2, 4, slot=0)                     # ... slot 0 keeps its state
    assert t.reuse == len(a) + len(ra.fed())
    assert t.ids == reference(cairn, tiny_dsv4, a2, 4).ids


def test_kv_share_copies_a_prefix_from_another_slot(spawn, cairn, tiny_dsv4):
    for share, want in (("1", True), ("0", False)):
        e = spawn("--slots", "2", "--kv-share", share, env={"CAIRN_PREFIX_LOG": "1"})
        base = words(26, 15)
        t0 = e.generate(base, 4, slot=0)
        p = base + t0.ids + words(27, 4)
        t1 = e.generate(p, 4, slot=1)
        assert t1.reuse == (len(base) + len(t0.fed()) if want else 0)
        assert t1.ids == reference(cairn, tiny_dsv4, p, 4).ids
        assert e.close() == 0
        log = e.read_stderr()
        assert ("(copy)" in log) == want, log


def test_prefix_log_line(spawn):
    e = spawn(env={"CAIRN_PREFIX_LOG": "1"})
    p = words(28, 8)
    t = e.generate(p, 3)
    e.generate(p + t.ids + [50], 3)
    assert e.close() == 0
    lines = [l for l in e.read_stderr().splitlines() if l.startswith("prefix:")]
    assert lines[0] == "prefix: slot 0 reused 0/8 (reset)"
    assert lines[1] == f"prefix: slot 0 reused {8 + len(t.fed())}/{8 + len(t.ids) + 1} (extend)"


def test_system_prompt_hint_serves_another_slot(spawn, cairn, tiny_dsv4, special):
    e = spawn("--slots", "2")
    system = [special["bos"]] + words(29, 12)
    a = system + [special["user"]] + words(30, 6) + [special["assistant"]]
    b = system + [special["user"]] + words(31, 7) + [special["assistant"]]
    # the hint (prefix_bytes, in payload bytes) marks the first 8 ids: a checkpoint with rows there
    hint = len(" ".join(map(str, system[:8])).encode())
    e.generate(a, 3, slot=0, prefix_bytes=hint)
    t = e.generate(b, 3, slot=1)
    assert t.reuse == 8
    assert t.ids == reference(cairn, tiny_dsv4, b, 3).ids


def test_scoring_with_max_tokens_zero(spawn):
    e = spawn()
    t = e.generate(words(32, 6), 0, logprobs=3)
    assert t.done is not None and t.completion == 0 and t.ids == [] and t.prompt_tokens == 6
    t = e.generate(words(32, 6), 0, logprobs=0)
    assert t.error.startswith("BAD_REQUEST")


def test_text_prompts_and_graceful_eof(spawn, cairn, tiny_dsv4):
    e = spawn()
    first = "Hello there, engine."
    t1 = e.generate(text=first, max_tokens=6, logprobs=0)
    assert t1.completion > 0 and len(t1.text) > 0 and t1.ids == []
    second = first + t1.text.decode("utf-8", errors="replace") + " And again?"
    t2 = e.submit("t2", text=second, max_tokens=6, logprobs=0)
    assert e.close() == 0                            # EOF right after the SUBMIT: it still finishes
    assert t2.done is not None and t2.reuse > 0
    ref = cold(cairn, tiny_dsv4, text=second, max_tokens=6, logprobs=0)
    assert ref.reuse == 0 and ref.text == t2.text and len(ref.text) > 0


def test_kv_dir_resumes_and_refuses_bad_files(spawn, cairn, tiny_dsv4, tmp_path):
    kv = str(tmp_path)
    e = spawn("--kv-dir", kv)
    prompt = words(33, 12)
    t1 = e.generate(prompt, 4)
    assert e.close() == 0
    path = os.path.join(kv, "slot-0.cairnkv")
    assert os.path.getsize(path) > 0
    turn2 = prompt + t1.ids + words(34, 3)
    r = spawn("--kv-dir", kv)
    t2 = r.generate(turn2, 4)
    assert t2.reuse == len(prompt) + len(t1.fed())
    assert t2.ids == reference(cairn, tiny_dsv4, turn2, 4).ids
    assert r.close() == 0
    assert "resumed with" in r.read_stderr()
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    c = spawn("--kv-dir", kv)
    t3 = c.generate(turn2, 4)
    assert t3.reuse == 0 and t3.ids == t2.ids
    assert c.close() == 0
    assert "ignoring" in c.read_stderr() and "checksum" in c.read_stderr()


def test_bench_reuse_json(cairn, tiny_dsv4):
    """`cairn bench reuse` drives the same reuse path: every turn from the second reuses the previous
    prompt and the fed reply, and every warm first token equals the cold one (ratios are only shape-checked:
    timings on a shared machine are not asserted)."""
    r = subprocess.run([cairn, "bench", "reuse", "-m", tiny_dsv4, "--turns", "4", "--system", "10", "--user", "6",
                        "--reply", "5", "--repeat", "1", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    turns = json.loads(r.stdout)["turns"]
    assert len(turns) == 4 and turns[0]["reused"] == 0
    for prev, cur in zip(turns, turns[1:]):
        assert cur["reused"] == prev["prompt_tokens"] + 5 - 1
        assert cur["prompt_tokens"] == prev["prompt_tokens"] + 5 + 6 + 2
    assert all(t["exact"] and t["warm_over_cold"] > 0 and t["warm_over_tail"] > 0 for t in turns)
