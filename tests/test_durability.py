"""Nothing acknowledged is lost (issue 16 §2), on the tiny model of every family.

With --kv-dir a turn's state is durable before its DONE: kill -9 right after DONE and the next
engine resumes the whole turn. A kill -9 at every step of a save (CAIRN_FAULT_KILL_AT, see
src/core/util.h fault_point) and a full disk (a small tmpfs) never leave a file that is trusted
wrongly: the next engine starts, resumes the old state, the new one, or nothing, and answers
exactly as a cold engine. A CANCEL during prefill or decode releases the slot with a consistent
record. Over HTTP a kill -9 mid-stream ends both APIs' streams cleanly."""
import json
import os
import signal
import socket
import subprocess

import pytest

from engine_client import Engine
from test_engine_protocol import CTX, model, reference, spawn, words  # noqa: F401 (fixtures)
from test_http_robustness import Server, chat_body, open_stream, servers, stream_lines, wait_until  # noqa: F401


def test_kill_right_after_done_keeps_the_turn(spawn, cairn, model, words, tmp_path):
    kv = str(tmp_path)
    e = spawn("--kv-dir", kv)
    prompt = words(1, 20)
    t1 = e.generate(prompt, 5)
    e.kill()                                  # SIGKILL the moment DONE arrived
    turn2 = prompt + t1.ids + words(2, 4)
    r = spawn("--kv-dir", kv)
    # Before READY the engine says what the resumed slot holds, as text (wire.h RECORD), so the
    # gateway can route the conversation back to it: one frame, slot 0, its payload then "\n".
    first, rest = r.banner.split(b"\n", 1)
    kind, slot, n = first.split(b" ")
    assert (kind, slot) == (b"RECORD", b"0"), r.banner[:80]
    n = int(n)
    assert n > 0 and rest[n:n + 1] == b"\n" and rest[n + 1:] == b"\x01\x01READY\x01\x01\n", r.banner[-80:]
    t2 = r.generate(turn2, 4)
    assert t2.reuse == len(prompt) + len(t1.fed()), "the acknowledged turn was not durable"
    assert t2.ids == reference(cairn, model, turn2, 4).ids


def save_steps(cairn, model, kv, turns):
    """Run the turns (each a prompt extending the last) on one engine; returns the replies."""
    e = Engine(cairn, model, "--ctx", str(CTX), "--kv-dir", kv)
    out = [e.generate(p, 3) for p in turns]
    assert e.close() == 0
    return out


def test_kill_at_every_persistence_step(cairn, model, words, tmp_path):
    """Turn 1 is saved by a clean engine; turn 2's save (an append, a commit, a tail rewrite, the
    checkpoint file) is cut by SIGKILL at step N = 1, 2, ... until a run gets through. The next
    engine must start, never trust a torn file, and answer turn 3 as a cold engine does; its reuse
    is the old state, the new one, a persisted checkpoint of either (a state that cannot truncate
    rewinds to one when turn 3 diverges from the new record), or 0 — and always the new one once
    turn 2's DONE was sent."""
    prompt = words(3, 24)
    base = str(tmp_path / "base")
    t1 = save_steps(cairn, model, base, [prompt])[0]
    turn2 = prompt + t1.ids + words(4, 6)
    old = len(prompt) + len(t1.fed())
    n, completed = 0, False
    while not completed:
        n += 1
        assert n < 200, "the save never completed"
        kv = str(tmp_path / f"kill-{n}")
        subprocess.run(["cp", "-r", base, kv], check=True)
        e = Engine(cairn, model, "--ctx", str(CTX), "--kv-dir", kv, env={"CAIRN_FAULT_KILL_AT": str(n)})
        e.submit("t2", ids=turn2, max_tokens=3)
        try:
            t2 = e.collect("t2")
            assert t2.done is not None, t2.error
            completed = True          # every step of the save passed
        except EOFError:
            t2 = None
            assert e.p.wait() == -signal.SIGKILL, e.read_stderr()
        e.kill()
        turn3 = turn2 + (t2.ids if t2 else []) + words(5, 3)
        r = Engine(cairn, model, "--ctx", str(CTX), "--kv-dir", kv, env={"CAIRN_PREFIX_LOG": "1"})
        t3 = r.generate(turn3, 3)
        assert r.close() == 0
        kind = r.prefix_log()[-1][3]
        assert t3.ids == reference(cairn, model, turn3, 3).ids, f"step {n}"
        if t2:
            assert t3.reuse == len(turn2) + len(t2.fed()), f"step {n}: turn 2 was acknowledged but not durable"
        else:
            # unacknowledged: the old state, or the new one (of which turn 3 shares turn 2's ids)
            assert t3.reuse in (0, old, len(turn2)) or (kind == "checkpoint" and t3.reuse < len(turn2)), \
                f"step {n}: reuse {t3.reuse} ({kind})"
    assert n > 5, f"only {n} steps: the fault points are not reached"


def mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    assert r.returncode == 0, "the full-disk test mounts a small tmpfs and needs root: " + r.stderr


def test_full_disk_keeps_serving_and_never_trusts_a_torn_file(cairn, model, words, tmp_path):
    kv = str(tmp_path / "small")
    mount_tmpfs(kv, "48k")
    try:
        e = Engine(cairn, model, "--ctx", str(CTX), "--kv-dir", kv)
        ids, replies = words(6, 10), []
        for k in range(8):                     # the record grows by ~20 positions a turn
            t = e.generate(ids, 4)
            assert t.done is not None, t.error
            replies.append(t)
            ids = ids + t.ids + words(7 + k, 16)
        assert e.close() == 0
        assert "No space left" in e.read_stderr(), "the disk never filled: make the tmpfs smaller"
        r = Engine(cairn, model, "--ctx", str(CTX), "--kv-dir", kv)
        t = r.generate(ids, 3)
        assert r.close() == 0
        assert t.ids == reference(cairn, model, ids, 3).ids
    finally:
        subprocess.run(["umount", kv])


def test_cancel_during_prefill_and_decode_keeps_the_record_consistent(spawn, cairn, model, words):
    e = spawn()
    long_prompt = words(8, 200)
    e.submit("p", ids=long_prompt, max_tokens=5)
    e.send(b"CANCEL p\n")
    rep = e.collect("p")
    assert rep.error == "CANCELLED" or rep.done is not None
    t = e.generate(long_prompt, 4)             # after a cut prefill the slot resets
    assert t.ids == reference(cairn, model, long_prompt, 4).ids
    e.submit("d", ids=words(9, 10), max_tokens=200)
    while len(e.replies["d"].ids) < 3:
        e.pump()
    e.send(b"CANCEL d\n")
    rep = e.collect("d")
    assert rep.error == "CANCELLED"
    again = words(9, 10) + rep.ids[:2]
    t = e.generate(again, 4)
    assert t.ids == reference(cairn, model, again, 4).ids


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_engine_killed_mid_stream_ends_the_stream_cleanly(family_model, tmp_path, api):
    s = Server(family_model.model, str(tmp_path), ["--ctx", "1024", "--kv-dir", str(tmp_path / "kv")])
    try:
        pid = s.engine_pid()
        path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
        body = {"messages": [{"role": "user", "content": "a long answer"}], "max_tokens": 900, "stream": True,
                "temperature": 0}
        c = s.conn()
        c.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        lines = stream_lines(r)
        next(lines)
        os.kill(pid, signal.SIGKILL)
        rest = list(lines)
        c.close()
        if api == "openai":
            data = [x[6:] for x in rest if x.startswith("data: ")]
            assert data[-1] == "[DONE]", rest[-4:]
            assert json.loads(data[-2])["error"]["code"] == "engine_restarted", rest[-4:]
        else:
            events = [x[7:] for x in rest if x.startswith("event: ")]
            assert events[-2:] == ["error", "message_stop"], rest[-6:]
        s.wait_restarts(1)
        st, _, b = s.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "after"}],
                                                           "max_tokens": 4, "temperature": 0})
        assert st == 200 and b["usage"]["completion_tokens"] == 4, b
    finally:
        s.stop()


def drop(sock, f):
    f.close()
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def test_disconnect_while_queued_never_reaches_the_engine(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--slots", "1"], {"FAKE_TOKEN_DELAY": "0.05"}, fake=True)
    busy = open_stream(s.port, "/v1/chat/completions", chat_body("first", max_tokens=60, stream=True))
    wait_until(lambda: s.health()["slots"]["busy"] == 1, what="the first request to hold the slot")
    queued = open_stream(s.port, "/v1/chat/completions", chat_body("queued", max_tokens=4))
    wait_until(lambda: s.health()["slots"]["waiting"] == 1, what="the second request to queue")
    drop(*queued)
    wait_until(lambda: s.health()["slots"]["waiting"] == 0, what="the queued client to leave the queue")
    assert b"200" in busy[1].readline()
    while busy[1].readline():             # the first request still runs to its end
        pass
    drop(*busy)
    wait_until(lambda: s.health()["slots"]["busy"] == 0, what="slot release")
    submitted = [f["prompt"] for f in s.fake_frames() if f["cmd"] == "SUBMIT"]
    assert len(submitted) == 1 and "queued" not in submitted[0], submitted
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("next"))
    assert st == 200, b


def test_disconnect_while_prefilling_cancels_and_releases(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--slots", "1"], {"FAKE_ACCEPT_DELAY": "30"}, fake=True)
    sock, f = open_stream(s.port, "/v1/chat/completions", chat_body("long prefill", max_tokens=4, stream=True))
    wait_until(lambda: any(x["cmd"] == "SUBMIT" for x in s.fake_frames()), what="the SUBMIT")
    drop(sock, f)
    wait_until(lambda: any(x["cmd"] == "CANCEL" for x in s.fake_frames()), what="CANCEL during the prefill")
    wait_until(lambda: s.health()["slots"]["busy"] == 0, what="slot release after the ack")
    assert [x["cmd"] for x in s.fake_frames()].count("CANCEL") == 1
