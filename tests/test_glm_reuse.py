"""Prefix reuse on GLM-5 through `cairn engine` (generic reuse layer + GLM's PART_ROWS state):
a warm turn must produce exactly the bytes a cold engine produces for the same prompt — extension,
truncation to the common prefix (an edited earlier message), an identical prompt, a prefix copied
from another slot, and a state persisted with --kv-dir across a kill -9. Persisted files that are
truncated, corrupt or from another model are ignored with a log line, and output stays correct."""
import os
import signal
import subprocess

import pytest

from conftest import make_model

READY = b"\x01\x01READY\x01\x01\n"
BASE = 960  # tiny vocab: [gMASK] = BASE + 2, <sop> = +4, <|system|> = +6, <|user|> = +7, <|assistant|> = +8
SYSTEM = [BASE + 2, BASE + 4, BASE + 6] + [(13 * i + 5) % 900 for i in range(14)]
TURN1 = SYSTEM + [BASE + 7] + [(29 * i + 3) % 900 for i in range(9)] + [BASE + 8, BASE + 21]
GEN = 6


class Engine:
    """Minimal engine-protocol client: token-id prompts, greedy, logprobs so each DATA frame names its token."""

    def __init__(self, cairn, model, *flags):
        self.p = subprocess.Popen([cairn, "engine", "-m", model, *flags], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.buf = b""
        self.next_id = 1
        self._until(READY)

    def _more(self):
        chunk = os.read(self.p.stdout.fileno(), 65536)
        if not chunk:
            raise EOFError("engine exited: " + self.p.stderr.read().decode(errors="replace")[-2000:])
        self.buf += chunk

    def _until(self, token):
        while token not in self.buf:
            self._more()
        i = self.buf.index(token) + len(token)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def _payload(self, n):
        while len(self.buf) < n + 1:
            self._more()
        self.buf = self.buf[n + 1:]

    def generate(self, ids, slot=0, max_tokens=GEN):
        """-> (DATA frame headers without the id, generated ids, reuse count from DONE)."""
        rid = str(self.next_id)
        self.next_id += 1
        body = " ".join(map(str, ids)).encode()
        self.p.stdin.write(b"SUBMIT %s %d %d %d 0 1 0 ids=1 logprobs=5\n" % (rid.encode(), slot, len(body), max_tokens)
                           + body + b"\n")
        self.p.stdin.flush()
        frames, out = [], []
        while True:
            f = self._until(b"\n")[:-1].decode().split()
            if len(f) < 2 or f[1] != rid:
                continue
            if f[0] == "DATA":
                self._payload(int(f[2]))
                frames.append(" ".join(f[2:]))
                if len(f) > 5:   # a token frame (a bare one only flushes held-back text bytes)
                    k = int(f[4])
                    pairs = f[5:5 + 2 * k]
                    out.append(int(pairs[max(range(k), key=lambda j: float(pairs[2 * j + 1]))]))
            elif f[0] == "DONE":
                return frames, out, int(f[9])
            elif f[0] == "ERROR":
                raise AssertionError("engine error: " + " ".join(f[2:]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.p.poll() is None:
            self.kill()

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=60)
        return self.p.stderr.read().decode(errors="replace")

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()


def cold(cairn, model, ids):
    with Engine(cairn, model) as e:
        return e.generate(ids)


@pytest.fixture(scope="module")
def model(tiny_glm):
    return tiny_glm


def test_extension_truncation_and_repeat_are_bitwise_cold(cairn, model):
    with Engine(cairn, model) as e:
        frames1, gen1, reused1 = e.generate(TURN1)
        assert reused1 == 0 and frames1 == cold(cairn, model, TURN1)[0]
        assert len(gen1) == GEN
        # Next turn: the reply (its last token was sampled, never fed) plus a new user message.
        turn2 = TURN1 + gen1 + [BASE + 7, 44, 55, 66, BASE + 8, BASE + 21]
        frames2, _, reused2 = e.generate(turn2)
        assert reused2 == len(TURN1) + GEN - 1
        assert frames2 == cold(cairn, model, turn2)[0]
        # Edit the first user message: truncate to the common prefix (inside the system part).
        edited = SYSTEM + [BASE + 7, 1, 2, 3, BASE + 8, BASE + 21]
        frames3, _, reused3 = e.generate(edited)
        assert reused3 == len(SYSTEM) + 1
        assert frames3 == cold(cairn, model, edited)[0]
        # The same prompt again: everything but the last token is reused, the last re-fed for logits.
        frames4, _, reused4 = e.generate(edited)
        assert reused4 == len(edited) - 1
        assert frames4 == frames3


def test_cross_slot_copy(cairn, model):
    with Engine(cairn, model, "--slots", "2") as shared, \
            Engine(cairn, model, "--slots", "2", "--kv-share", "0") as isolated:
        prompt_b = TURN1[:-2] + [77, 88, BASE + 8, BASE + 21]
        for e in (shared, isolated):
            e.generate(TURN1, slot=0)
        frames, _, reused = shared.generate(prompt_b, slot=1)
        assert reused == len(TURN1) - 2, "slot 1 should copy the common prefix from slot 0"
        assert frames == cold(cairn, model, prompt_b)[0]
        frames_iso, _, reused_iso = isolated.generate(prompt_b, slot=1)
        assert reused_iso == 0 and frames_iso == frames


def persisted_turn(cairn, model, kv_dir):
    """One turn on slot 0 of an engine with --kv-dir, then kill -9. The engine saves a slot right
    after its DONE and before reading the next command, so a finished request on slot 1 proves
    slot 0's file is complete before the kill."""
    os.makedirs(kv_dir, exist_ok=True)
    with Engine(cairn, model, "--slots", "2", "--kv-dir", kv_dir) as e:
        _, gen1, _ = e.generate(TURN1)
        e.generate([BASE + 2, BASE + 4, 9], slot=1, max_tokens=1)
        e.kill()
    path = os.path.join(kv_dir, "slot-0.cairnkv")
    assert os.path.exists(path)
    return path, TURN1 + gen1 + [BASE + 7, 12, 34, BASE + 8, BASE + 21]


def test_restart_resumes_persisted_rows(cairn, model, tmp_path):
    path, turn2 = persisted_turn(cairn, model, str(tmp_path))
    with Engine(cairn, model, "--slots", "2", "--kv-dir", str(tmp_path)) as e:
        frames, _, reused = e.generate(turn2)
        log = e.close()
    assert "resumed" in log, log
    assert reused == len(TURN1) + GEN - 1
    assert frames == cold(cairn, model, turn2)[0]


def damage_truncate(path, _other):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def damage_flip(path, _other):
    data = bytearray(open(path, "rb").read())
    data[len(data) * 3 // 4] ^= 0x40
    open(path, "wb").write(bytes(data))


def damage_foreign(path, other):
    """A valid file written by a model with the same shapes but other weights."""
    os.replace(other, path)


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_foreign])
def test_bad_persisted_file_is_ignored(cairn, model, tmp_path, damage):
    path, turn2 = persisted_turn(cairn, model, str(tmp_path / "a"))
    other_model = make_model("glm", seed=99)
    other_path, _ = persisted_turn(cairn, other_model, str(tmp_path / "b"))
    damage(path, other_path)
    with Engine(cairn, model, "--slots", "2", "--kv-dir", str(tmp_path / "a")) as e:
        frames, _, reused = e.generate(turn2)
        log = e.close()
    assert "ignoring" in log, log
    # Nothing comes from the damaged slot-0 file; slot 1's turn was durable before its DONE (the
    # kill came after it), and its [gMASK]<sop> is the longest prefix another slot can lend.
    assert reused == 2
    assert frames == cold(cairn, model, turn2)[0]


@pytest.mark.parametrize("at", [3, 8, 20])
def test_snapshot_restore_mid_prompt_is_exact(cairn, model, at):
    """A snapshot taken after `at` prompt tokens (before, at and past index_topk), serialized and
    restored into a fresh sequence, continues exactly like an uninterrupted run."""
    def run(*extra):
        r = subprocess.run([cairn, "run", "-m", model, "--prompt-ids", ",".join(map(str, TURN1)), "-n", "6",
                            "--temperature", "0", "--format", "jsonl", "--top-logprobs", "5", *extra],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert run("--snapshot-at", str(at)) == run()
