"""`cairn run --chat` over a pipe, on every registered family: the REPL feeds the exact ids it
generated (never re-tokenizing a reply) through the shared reuse layer, so from turn 2 on the
reuse count is prompt + reply - 1 of the turn before (the last sampled token is never fed), and
each turn's answer equals a cold `cairn run` given the same ids. Also /help, /reset, /exit and
Ctrl-C (stops the reply, not the program)."""
import json
import os
import re
import select
import signal
import subprocess

GEN = 6
TURNS = ["Hello there", "How are you today", "Tell me more about it"]


def repl(cairn, model, lines, *extra):
    p = subprocess.run([cairn, "run", "-m", model, "--chat", "-n", str(GEN), "--temperature", "0",
                        "--format", "jsonl", *extra], input="".join(l + "\n" for l in lines).encode(),
                       capture_output=True)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return parse(p.stdout.decode()), p.stderr.decode()


def parse(out):
    """[(turn record {turn, prompt_ids, reused}, [reply ids])] from the jsonl stdout."""
    turns = []
    for line in out.splitlines():
        row = json.loads(line)
        if "turn" in row:
            turns.append((row, []))
        else:
            turns[-1][1].append(row["id"])
    return turns


def cold_reply(cairn, model, ids):
    p = subprocess.run([cairn, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", str(GEN),
                        "--temperature", "0", "--format", "jsonl"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return [json.loads(l)["id"] for l in p.stdout.splitlines()]


def test_three_turns_reuse_prompt_and_reply_and_match_cold(cairn, family_model):
    turns, err = repl(cairn, family_model.model, TURNS)
    assert len(turns) == 3, err
    assert turns[0][0]["reused"] == 0
    for (prev, reply), (cur, _) in zip(turns, turns[1:]):
        assert reply, "no reply tokens"
        want = prev["prompt_ids"] + reply
        # the previous prompt and every generated id, exactly (an ending EOS the template writes
        # next is kept, one it does not write is dropped: it was never fed)
        assert cur["prompt_ids"][:len(want) - 1] == want[:-1] and len(cur["prompt_ids"]) > len(want)
        assert cur["reused"] == len(prev["prompt_ids"]) + len(reply) - 1
    shown = [(int(u), int(n)) for u, n in re.findall(r"\[reused (\d+) of (\d+) prompt tokens\]", err)]
    assert shown == [(t["reused"], len(t["prompt_ids"])) for t, _ in turns]
    for t, reply in turns:
        assert reply == cold_reply(cairn, family_model.model, t["prompt_ids"]), f"turn {t['turn']}"


def test_commands(cairn, family_model):
    turns, err = repl(cairn, family_model.model, ["/help", TURNS[0], "/reset", TURNS[0], "/exit", TURNS[1]])
    assert "/reset" in err and "/exit" in err and "Ctrl-C" in err, err
    assert "[new conversation]" in err
    assert len(turns) == 2, "a line after /exit was answered"
    # after /reset the conversation starts over: the same message renders to the same prompt
    assert turns[1][0]["prompt_ids"] == turns[0][0]["prompt_ids"]
    assert turns[1][1] == turns[0][1]


def read_until(p, buf, pattern):
    while not re.search(pattern, buf[0]):
        r, _, _ = select.select([p.stdout], [], [], 120)
        assert r, "the REPL went silent"
        chunk = os.read(p.stdout.fileno(), 1 << 16)
        assert chunk, "the REPL exited"
        buf[0] += chunk.decode()


def test_ctrl_c_stops_the_reply_not_the_program(cairn, family_model):
    p = subprocess.Popen([cairn, "run", "-m", family_model.model, "--chat", "-n", "100000", "--ignore-eos",
                          "--temperature", "0", "--format", "jsonl", "--ctx", "100000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        buf = [""]
        p.stdin.write((TURNS[0] + "\n").encode())
        p.stdin.flush()
        read_until(p, buf, r'(\{"id".*\n){3}')
        p.send_signal(signal.SIGINT)
        p.stdin.write((TURNS[1] + "\n").encode())
        p.stdin.flush()
        read_until(p, buf, r'"turn":2')
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(b"/exit\n", timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err.decode()[-2000:]
    assert err.decode().count("[reply stopped]") == 2
    turns = parse(buf[0] + out.decode())
    assert len(turns) == 2 and 3 <= len(turns[0][1]) < 100000
    first, reply = turns[0]
    assert turns[1][0]["reused"] == len(first["prompt_ids"]) + len(reply) - 1
