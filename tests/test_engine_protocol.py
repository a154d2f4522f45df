"""`cairn engine` over the line protocol, on the tiny model of every family (fixture family_model):
DeepSeek V4 is extend-only (its window ring and compressor state cannot rewind, so everything
beyond a strict extension needs a checkpoint), GLM truncates to any common prefix.

Every warm answer is compared token for token with a freshly started engine (cold), and every
reuse is asserted by its exact DONE count, derived per family from the rule in src/state/reuse.h
(engine_client.expected_reuse) and where the two families differ also by the decision's kind, so
an optimisation that silently never fires fails.
"""
import json
import os
import random
import subprocess

import pytest

from engine_client import Engine, cold, expected_reuse, lcp

CTX = 256
LOG = {"CAIRN_PREFIX_LOG": "1"}


@pytest.fixture
def model(family_model):
    return family_model.model


@pytest.fixture
def spawn(cairn, model):
    started = []

    def start(*args, env=None):
        e = Engine(cairn, model, "--ctx", str(CTX), *args, env=env)
        started.append(e)
        return e

    yield start
    for e in started:
        e.kill()


@pytest.fixture
def words(family_model):
    def make(seed, n):
        """Ordinary (non-special) token ids of this family, deterministic per seed."""
        r = random.Random(seed)
        return [r.randrange(20, family_model.ordinary_hi) for _ in range(n)]
    return make


def reference(cairn, model, ids, max_tokens, **kw):
    return cold(cairn, model, ids=ids, max_tokens=max_tokens, args=("--ctx", str(CTX)), **kw)


def kinds(e):
    """The kinds of the engine's reuse decisions (it must run with LOG and be closed)."""
    return [k for _, _, _, k in e.prefix_log()]



def test_handshake(spawn, family_model):
    e = spawn()
    assert e.banner.endswith(b"\x01\x01READY\x01\x01\n")
    assert e.caps.startswith("CAPS ") and "slots=1" in e.caps.split() and f"ctx={CTX}" in e.caps.split()
    # the capabilities the reuse expectations of this file rest on come from the engine itself
    caps = dict(kv.split("=", 1) for kv in e.caps.split()[1:])
    assert caps["family"] == family_model.name and caps["checkpoints"] == "1"
    assert caps["truncate"] == ("0" if family_model.extend_only else "1")
    stat = e.stat.split()
    assert stat[0] == "STAT" and len(stat) >= 5
    assert e.close() == 0


def test_second_turn_reuses_and_matches_cold(spawn, cairn, model, words):
    e = spawn()
    prompt = words(1, 12)
    t1 = e.generate(prompt, 6)
    assert t1.reuse == 0 and t1.accept == len(prompt) and t1.prompt_tokens == len(prompt)
    assert len(t1.ids) == t1.completion > 0
    turn2 = prompt + t1.ids + words(2, 5)
    t2 = e.generate(turn2, 6)
    assert t2.reuse == len(prompt) + len(t1.fed())   # a strict extension: every family keeps it all
    ref = reference(cairn, model, turn2, 6)
    assert ref.reuse == 0 and t2.ids == ref.ids and t2.text == ref.text


def test_identical_prompt_reuses_all_but_the_last_token(spawn, cairn, model, family_model, words):
    e = spawn(env=LOG)
    prompt = words(3, 20)
    t1 = e.generate(prompt, 5)
    t2 = e.generate(prompt, 5)
    # upstream re-prefills here. DeepSeek V4 restores the checkpoint its prefill took after the
    # last-but-one token; GLM truncates its record (prompt + reply) to that point.
    want = expected_reuse(family_model, prompt + t1.fed(), prompt, checkpoints=[len(prompt) - 1])
    assert want[0] == len(prompt) - 1
    assert t2.reuse == want[0]
    assert t2.ids == t1.ids == reference(cairn, model, prompt, 5).ids
    assert e.close() == 0
    assert kinds(e) == ["reset", want[1]]


def test_done_reports_the_prefill_time(spawn, words):
    """DONE's last field is the engine's time prefilling the request's new tokens: the gateway's
    measured prefill rate (/metrics, the chat page's cold-prefill estimate) is made of it."""
    e = spawn()
    prompt = words(5, 40)
    t1 = e.generate(prompt, 3)
    assert t1.reuse == 0 and t1.prefill_us is not None and t1.prefill_us > 0
    t2 = e.generate(prompt + t1.ids + words(6, 30), 3)
    assert t2.reuse > 0 and t2.prefill_us is not None and t2.prefill_us > 0


def test_divergent_prompt_resets_and_matches_cold(spawn, cairn, model, words):
    e = spawn()
    prompt = words(4, 16)
    e.generate(prompt, 4)
    shifted = [i + 1 for i in prompt]
    t = e.generate(shifted, 4)
    assert t.reuse == 0
    assert t.ids == reference(cairn, model, shifted, 4).ids


def chat(fam, *turns):
    """The family's start ids, then user-turn assistant-turn ... ; each turn is a list of ids."""
    out = list(fam.start)
    for i, t in enumerate(turns):
        out += [fam.user if i % 2 == 0 else fam.assistant] + t
    return out


def test_regenerate_reuses_all_but_the_last_token(spawn, cairn, model, family_model, words):
    e = spawn(env=LOG)
    prompt = chat(family_model, words(5, 10)) + [family_model.assistant]
    first = e.generate(prompt, 6)
    again = e.generate(prompt, 6)
    want = expected_reuse(family_model, prompt + first.fed(), prompt, checkpoints=[len(prompt) - 1])
    assert want[0] == len(prompt) - 1
    assert again.reuse == want[0]
    assert again.ids == first.ids == reference(cairn, model, prompt, 6).ids
    assert e.close() == 0
    assert kinds(e) == ["reset", want[1]]


def test_edit_last_user_message_keeps_the_history(spawn, cairn, model, family_model, words):
    fam = family_model
    e = spawn(env=LOG)
    p1 = chat(fam, words(6, 9)) + [fam.assistant]
    r1 = e.generate(p1, 5)
    history = p1 + r1.ids
    # DeepSeek V4: the turn boundary is the new user marker at len(history); it lies just past the
    # start of p2's feed (the reply's unfed last token, if any), so the checkpoint is taken there
    boundary = len(p1) + len(r1.fed())
    p2 = history + [fam.user] + words(7, 8) + [fam.assistant]
    r2 = e.generate(p2, 5)
    edited = history + [fam.user] + words(8, 11) + [fam.assistant]
    t = e.generate(edited, 5)
    # GLM truncates to the common prefix: the history, the user marker and any shared leading words
    want = expected_reuse(fam, p2 + r2.fed(), edited, checkpoints=[boundary])
    assert want[0] == (boundary if fam.extend_only else lcp(p2, edited)) > len(p1)
    assert t.reuse == want[0]
    assert t.ids == reference(cairn, model, edited, 5).ids
    assert e.close() == 0
    assert kinds(e) == ["reset", "extend", want[1]]


def test_ten_turn_conversation_reuse_grows(spawn, cairn, model, family_model, words):
    fam = family_model
    e = spawn()
    prompt = chat(fam, words(9, 6)) + [fam.assistant]
    reuses = []
    for turn in range(10):
        t = e.generate(prompt, 3)
        if turn:
            assert t.reuse == expect, f"turn {turn}"
        reuses.append(t.reuse)
        expect = len(prompt) + len(t.fed())
        prompt = prompt + t.ids + [fam.user] + words(100 + turn, 4) + [fam.assistant]
    assert all(b > a for a, b in zip(reuses, reuses[1:])), reuses
    assert len(prompt) < CTX
    last = e.generate(prompt, 3)
    assert last.reuse == expect
    assert last.ids == reference(cairn, model, prompt, 3).ids


def test_cancel_mid_decode_then_next_turn_is_exact(spawn, cairn, model, words):
    e = spawn()
    # The CANCEL goes out when the first token arrives; a tiny model on a loaded machine can
    # finish its reply before the test process reads that frame. Such a turn ended with DONE and
    # proves nothing, so try again on a fresh prompt; the test fails if no CANCEL ever lands.
    for attempt in range(8):
        prompt, rid = words(10 + 2 * attempt, 10), f"c{attempt}"
        rep = e.submit(rid, ids=prompt, max_tokens=200)
        while not rep.ids:
            e.pump()
        e.send(f"CANCEL {rid}\n".encode())
        e.collect(rid)
        if rep.done is None:
            break
    assert rep.error == "CANCELLED" and rep.done is None, "no CANCEL landed mid-decode in 8 attempts"
    turn2 = prompt + rep.ids + words(11 + 2 * attempt, 4)
    t = e.generate(turn2, 4)
    assert t.reuse == len(prompt) + len(rep.fed(stopped=True))
    assert t.ids == reference(cairn, model, turn2, 4).ids
    e.send(f"CANCEL {rid}\n".encode())
    f, _ = e.pump()
    assert f == ["ERROR", rid, "NOT_FOUND"]


def test_stop_ends_through_done_and_keeps_state(spawn, cairn, model, words):
    e = spawn()
    prompt = words(12, 10)
    # STOP follows the SUBMIT at once: waiting for the first token first races a fast tiny model
    # (the Inkling one decodes its 200 tokens before a loaded test process reads one frame)
    rep = e.submit("s1", ids=prompt, max_tokens=200)
    e.send(b"STOP s1\n")
    e.collect("s1")
    assert rep.done is not None and not rep.length_limited and rep.completion == len(rep.ids) < 200
    turn2 = prompt + rep.ids + words(13, 4)
    t = e.generate(turn2, 4)
    assert t.reuse == len(prompt) + len(rep.fed(stopped=True))
    assert t.ids == reference(cairn, model, turn2, 4).ids


def test_every_error_code(spawn, words):
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


def test_failed_turn_taints_and_next_turn_is_exact(spawn, cairn, model, words):
    e = spawn()
    prompt = words(18, 12)
    t1 = e.generate(prompt, 4)
    failed = e.generate(prompt + t1.ids + words(19, CTX), 4)
    assert failed.error.startswith("CONTEXT_EXCEEDED")
    turn2 = prompt + t1.ids + words(20, 5)
    t2 = e.generate(turn2, 4)
    assert t2.reuse == 0                           # the slot was tainted (on every family): re-prefilled
    assert t2.ids == reference(cairn, model, turn2, 4).ids
    t3 = e.generate(turn2 + t2.ids + words(21, 3), 4)
    assert t3.reuse == len(turn2) + len(t2.fed())  # and reuse works again afterwards


def test_slots_are_independent(spawn, cairn, model, words):
    e = spawn("--slots", "2", "--kv-share", "0")
    a, b = words(22, 14), words(23, 9)
    ra = e.submit("a", ids=a, max_tokens=6, slot=0)
    rb = e.submit("b", ids=b, max_tokens=6, slot=1)
    e.collect("a")
    e.collect("b")
    assert ra.ids == reference(cairn, model, a, 6).ids
    assert rb.ids == reference(cairn, model, b, 6).ids
    bad = e.generate(words(24, CTX + 1), 2, slot=1)   # slot 1 fails ...
    assert bad.error.startswith("CONTEXT_EXCEEDED")
    a2 = a + ra.ids + words(25, 3)
    t = e.generate(a2, 4, slot=0)                     # ... slot 0 keeps its state
    assert t.reuse == len(a) + len(ra.fed())
    assert t.ids == reference(cairn, model, a2, 4).ids


def test_kv_share_copies_a_prefix_from_another_slot(spawn, cairn, model, words):
    for share, want in (("1", True), ("0", False)):
        e = spawn("--slots", "2", "--kv-share", share, env=LOG)
        base = words(26, 15)
        t0 = e.generate(base, 4, slot=0)
        p = base + t0.ids + words(27, 4)
        t1 = e.generate(p, 4, slot=1)
        # slot 0's whole record is a prefix of p: every family can copy it
        assert t1.reuse == (len(base) + len(t0.fed()) if want else 0)
        assert t1.ids == reference(cairn, model, p, 4).ids
        assert e.close() == 0
        assert kinds(e) == ["reset", "copy" if want else "reset"], e.read_stderr()


def test_kv_share_copies_the_longest_prefix_the_family_can_use(spawn, cairn, model, family_model, words):
    e = spawn("--slots", "3", env=LOG)
    x = words(40, 10)
    rx = e.generate(x, 4, slot=0)
    head = x + rx.ids
    y = head + words(41, 2) + words(42, 5)
    ry = e.generate(y, 4, slot=1)
    p = head + words(41, 2) + words(43, 3)
    t = e.generate(p, 4, slot=2)
    # slot 0's whole record is a prefix of p; slot 1 holds more of p, but only as a prefix it must
    # truncate to. GLM can, and copies that; DeepSeek V4 cannot, and copies slot 0's record.
    if family_model.extend_only:
        want = len(x) + len(rx.fed())
    else:
        want = min(lcp(y + ry.fed(), p), len(p) - 1)
        assert want > len(x) + len(rx.fed())
    assert t.reuse == want
    assert t.ids == reference(cairn, model, p, 4).ids
    assert e.close() == 0
    assert kinds(e) == ["reset", "copy", "copy"]


def test_prefix_log_line(spawn, words):
    e = spawn(env=LOG)
    p = words(28, 8)
    t = e.generate(p, 3)
    e.generate(p + t.ids + [50], 3)
    assert e.close() == 0
    lines = [l for l in e.read_stderr().splitlines() if l.startswith("prefix:")]
    assert lines[0] == "prefix: slot 0 reused 0/8 (reset)"
    assert lines[1] == f"prefix: slot 0 reused {8 + len(t.fed())}/{8 + len(t.ids) + 1} (extend)"


def test_system_prompt_hint_serves_another_slot(spawn, cairn, model, family_model, words):
    fam = family_model
    e = spawn("--slots", "2", env=LOG)
    system = fam.start + words(29, 12)
    a = system + [fam.user] + words(30, 6) + [fam.assistant]
    b = system + [fam.user] + words(31, 7) + [fam.assistant]
    # the hint (prefix_bytes, in payload bytes) marks the first 8 ids: a checkpoint with rows there
    hint = len(" ".join(map(str, system[:8])).encode())
    ra = e.generate(a, 3, slot=0, prefix_bytes=hint)
    t = e.generate(b, 3, slot=1)
    if fam.extend_only:
        want = (8, "checkpoint")     # slot 0 cannot rewind to the common prefix: the hint serves
    else:
        # slot 0 can truncate a copy of itself (kv-share is on by default): the common prefix,
        # system prompt and user marker at least, beats the hinted checkpoint
        want = (min(lcp(a + ra.fed(), b), len(b) - 1), "copy")
        assert want[0] >= len(system) + 1
    assert t.reuse == want[0]
    assert t.ids == reference(cairn, model, b, 3).ids
    assert e.close() == 0
    assert kinds(e) == ["reset", want[1]]


def test_scoring_with_max_tokens_zero(spawn, words):
    e = spawn()
    t = e.generate(words(32, 6), 0, logprobs=3)
    assert t.done is not None and t.completion == 0 and t.ids == [] and t.prompt_tokens == 6
    t = e.generate(words(32, 6), 0, logprobs=0)
    assert t.error.startswith("BAD_REQUEST")


def test_text_prompts_and_graceful_eof(spawn, cairn, model):
    e = spawn()
    first = "Hello there, engine."
    t1 = e.generate(text=first, max_tokens=6, logprobs=0)
    assert t1.completion > 0 and len(t1.text) > 0 and t1.ids == []
    second = first + t1.text.decode("utf-8", errors="replace") + " And again?"
    t2 = e.submit("t2", text=second, max_tokens=6, logprobs=0)
    assert e.close() == 0                            # EOF right after the SUBMIT: it still finishes
    assert t2.done is not None and t2.reuse > 0
    ref = cold(cairn, model, text=second, max_tokens=6, logprobs=0)
    assert ref.reuse == 0 and ref.text == t2.text and len(ref.text) > 0


def test_kv_dir_resumes_and_refuses_bad_files(spawn, cairn, model, words, tmp_path):
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
    assert t2.ids == reference(cairn, model, turn2, 4).ids
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


def test_kv_dir_survives_kill_9(spawn, cairn, model, words, tmp_path):
    """The engine saves a slot right after its DONE, before reading the next command, so a finished
    request on slot 1 proves slot 0's file is complete; after kill -9 (SIGKILL: no shutdown code
    runs) a new engine resumes slot 0's whole state, every part kind included, and answers the
    next turn exactly like a cold engine."""
    kv = str(tmp_path)
    e = spawn("--kv-dir", kv, "--slots", "2")
    prompt = words(35, 14)
    t1 = e.generate(prompt, 4)
    e.generate(words(36, 3), 1, slot=1)
    e.kill()
    assert e.p.returncode == -9
    turn2 = prompt + t1.ids + words(37, 3)
    r = spawn("--kv-dir", kv, "--slots", "2")
    t2 = r.generate(turn2, 4)
    assert t2.reuse == len(prompt) + len(t1.fed())
    assert t2.ids == reference(cairn, model, turn2, 4).ids
    assert r.close() == 0
    assert "resumed with" in r.read_stderr()


def test_bench_reuse_json(cairn, family_model):
    """`cairn bench reuse` drives the same reuse path: every turn from the second reuses the previous
    prompt and the fed reply, and every warm first token equals the cold one (ratios are only shape-checked:
    timings on a shared machine are not asserted). The warm arm pays what the engine pays: a state that
    cannot truncate takes its light checkpoints on every turn, a rows-only one needs none after the
    system prompt's."""
    r = subprocess.run([cairn, "bench", "reuse", "-m", family_model.model, "--turns", "4", "--system", "10", "--user",
                        "6", "--reply", "5", "--repeat", "2", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    turns = json.loads(r.stdout)["turns"]
    assert len(turns) == 4 and turns[0]["reused"] == 0
    for prev, cur in zip(turns, turns[1:]):
        assert cur["reused"] == prev["prompt_tokens"] + 5 - 1
        assert cur["prompt_tokens"] == prev["prompt_tokens"] + 5 + 6 + 2
    assert all(t["exact"] and t["warm_over_cold"] > 0 and t["warm_over_tail"] > 0 for t in turns)
    assert turns[0]["checkpoints"] >= 1
    assert all((t["checkpoints"] >= 1) == family_model.extend_only for t in turns[1:]), turns
