"""Checkpoints survive a restart (src/state/persist.h CHECKPOINTS): beside each slot's state,
--kv-dir keeps the deepest light checkpoints the slot made, so a restarted engine whose state
cannot truncate (a window ring, a recurrence: every family whose descriptor says truncates=0)
still rewinds — a regenerated or edited turn after the restart is warm, and exact against a cold
engine. A checkpoint file that is corrupt, torn or of another record is refused by name and
costs only warmth."""
import os
import random
import re

import pytest

from conftest import FAMILIES, Family, make_model
from engine_client import Engine, cold

CTX = 128
LOG = {"CAIRN_PREFIX_LOG": "1"}
EXTEND_ONLY = [f for f in FAMILIES if not f["truncates"]]


@pytest.fixture(scope="module", params=EXTEND_ONLY, ids=[f["name"] for f in EXTEND_ONLY])
def fam(request):
    return Family(request.param, make_model(request.param["name"]))


def conversation(fam, seed, n):
    r = random.Random(seed)
    words = [r.randrange(20, fam.ordinary_hi) for _ in range(n)]
    return fam.start + [fam.user] + words + [fam.assistant]


def first_turn(cairn, fam, kv, prompt):
    e = Engine(cairn, fam.model, "--ctx", str(CTX), "--kv-dir", kv)
    t1 = e.generate(prompt, 5)
    assert e.close() == 0
    assert os.path.exists(os.path.join(kv, "slot-0.cairnkv.ckpt"))
    return t1


def restarted(cairn, fam, kv, prompt):
    e = Engine(cairn, fam.model, "--ctx", str(CTX), "--kv-dir", kv, env=LOG)
    t = e.generate(prompt, 5)
    assert e.close() == 0
    return t, e.prefix_log()[-1], e.read_stderr()


def test_regenerate_after_restart_rewinds_through_a_saved_checkpoint(cairn, fam, tmp_path):
    kv = str(tmp_path / "kv")
    prompt = conversation(fam, 1, 16)
    t1 = first_turn(cairn, fam, kv, prompt)
    t2, (slot, reused, total, kind), log = restarted(cairn, fam, kv, prompt)
    # the resumed state holds prompt + reply, which the same prompt does not extend: only the
    # checkpoint the prefill took after the last-but-one prompt token lets it reuse anything
    m = re.search(r"slot 0 resumed (\d+) checkpoints", log)
    assert m and 1 <= int(m.group(1)) <= 4, log[-2000:]
    assert (kind, reused, total) == ("checkpoint", len(prompt) - 1, len(prompt))
    ref = cold(cairn, fam.model, ids=prompt, max_tokens=5, args=("--ctx", str(CTX)))
    assert t2.ids == t1.ids == ref.ids and t2.text == ref.text


def test_edited_turn_after_restart_is_warm_and_exact(cairn, fam, tmp_path):
    kv = str(tmp_path / "kv")
    prompt = conversation(fam, 2, 16)
    t1 = first_turn(cairn, fam, kv, prompt)
    # a long second turn, then an edit of its last user message after a restart: the deepest
    # checkpoint the edit still shares is one the second turn's prefill took
    turn2 = prompt + t1.ids + [fam.user] + conversation(fam, 3, 12)[len(fam.start) + 1:]
    e = Engine(cairn, fam.model, "--ctx", str(CTX), "--kv-dir", kv)
    e.generate(turn2, 4)
    assert e.close() == 0
    edit = turn2[:-3] + [21, 22, fam.assistant]
    t3, (_, reused, _, kind), _ = restarted(cairn, fam, kv, edit)
    assert kind == "checkpoint" and len(prompt) < reused < len(edit) - 3
    ref = cold(cairn, fam.model, ids=edit, max_tokens=5, args=("--ctx", str(CTX)))
    assert t3.ids == ref.ids and t3.text == ref.text


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_bad_checkpoint_file_is_refused_and_costs_only_warmth(cairn, fam, tmp_path, damage):
    kv = str(tmp_path / "kv")
    prompt = conversation(fam, 4, 16)
    t1 = first_turn(cairn, fam, kv, prompt)
    path = os.path.join(kv, "slot-0.cairnkv.ckpt")
    data = open(path, "rb").read()
    if damage == "flip":
        data = data[:-40] + bytes([data[-40] ^ 1]) + data[-39:]
    elif damage == "truncate":
        data = data[:len(data) // 2]
    else:
        # a checkpoint file of another conversation beside this slot's state
        other = str(tmp_path / "other")
        first_turn(cairn, fam, other, conversation(fam, 5, 16))
        data = open(os.path.join(other, "slot-0.cairnkv.ckpt"), "rb").read()
    open(path, "wb").write(data)
    t2, (_, reused, _, kind), log = restarted(cairn, fam, kv, prompt)
    assert "kv-dir: ignoring" in log and "slot-0.cairnkv.ckpt" in log, log[-2000:]
    assert (kind, reused) == ("reset", 0)
    assert t2.ids == t1.ids
