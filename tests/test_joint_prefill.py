"""Prefill chunks join the batched decode step (src/serve/engine.c joint_step, seq_join_rows in
src/models/model.h): while conversations decode, a long prompt on another slot is prefilled in
the same forward calls as their tokens, a chunk per step sized to fill the pass the decode rows
start. Every conversation must still come out bit-identical to running it alone on a fresh
engine, the prefilled slot's light checkpoints (captured inside the joint calls) must restore
exactly, and the step log must show the joining fired with the dense weights read once per
step. A CANCEL that lands between joint steps leaves the other conversations exact.
"""
import re

from engine_client import Engine, cold
from test_grammar_engine import GBNF, SHAPE

CTX = 1024
STEP = re.compile(r"step: (\d+) slots decoded in one forward call, weight bytes streamed: dense (\d+) routed (\d+);"
                  r" prefill rows (\d+) of (\d+) requests")


def ids_of(family, n, salt):
    hi = family.ordinary_hi
    return [20 + (13 * k + 7 * salt + (k * k) % 5) % (hi - 20) for k in range(n)]


# The decoding slot of the CANCEL, STOP and grammar tests must still be decoding when the other
# request arrives and while its chunks are fed: a tiny model decodes thousands of tokens a second,
# so a 60-token reply could end before the test's next write reached the engine. Greedy from this
# prompt every family's tiny model writes at least 474 tokens before an end token, so the slot
# decodes DEC_TOKENS steps whatever the timing.
DEC_TOKENS = 400


def decoder_ids(family):
    return ids_of(family, 10, 17)


def steps_of(e):
    return [tuple(map(int, m)) for m in STEP.findall(e.read_stderr())]


def test_decoding_slots_stay_exact_while_another_prefills(cairn, family_model):
    model = family_model.model
    short = [ids_of(family_model, 9, 1), ids_of(family_model, 14, 2)]
    long = ids_of(family_model, 900, 3)             # several chunks at any family's pass size
    params = [(24, 0.0), (24, 0.8)]                 # one greedy, one sampled (seeded) decoder
    e = Engine(cairn, model, "--ctx", str(CTX), "--slots", "3", "--kv-share", "0", env={"CAIRN_STEP_LOG": "1"})
    try:
        with e.one_write():                      # all three SUBMITs reach the engine in one write
            reps = [e.submit("d%d" % i, ids=p, max_tokens=mt, slot=i, temperature=t)
                    for i, (p, (mt, t)) in enumerate(zip(short, params))]
            lrep = e.submit("long", ids=long, max_tokens=6, slot=2)
        for r in ("d0", "d1", "long"):
            e.collect(r)
        # regenerate with the last prompt token edited: the n - 1 point was captured inside a joint
        # call (or the rows truncate), and the restored state must be exact
        edited = long[:-1] + [long[-1] + 1 if long[-1] + 1 < family_model.ordinary_hi else 21]
        again = e.generate(edited, 6, slot=2)
    finally:
        e.close()
    steps = steps_of(e)
    joint = [s for s in steps if s[0] >= 1 and s[3] >= 1]
    assert len(joint) >= 2, f"the long prompt's chunks never joined two decode steps: {steps}"
    decode_only = {s[1] for s in steps if s[0] >= 1 and s[3] == 0}
    assert len(decode_only) == 1 and min(decode_only) > 0, f"decode-only steps' dense bytes vary: {steps}"
    assert all(s[1] == min(decode_only) for s in joint), \
        f"a joint step read the dense weights more than once (one decode step: {decode_only}): {joint}"
    for i, (p, (mt, t)) in enumerate(zip(short, params)):
        alone = cold(cairn, model, ids=p, max_tokens=mt, temperature=t, args=("--ctx", str(CTX)))
        assert reps[i].error is None and alone.error is None
        assert (reps[i].ids, reps[i].lps, reps[i].text) == (alone.ids, alone.lps, alone.text), f"slot {i} differs"
    alone = cold(cairn, model, ids=long, max_tokens=6, args=("--ctx", str(CTX)))
    assert lrep.error is None and (lrep.ids, lrep.lps) == (alone.ids, alone.lps), "the joined prefill differs"
    assert again.error is None and again.reuse == len(long) - 1, f"edit-last reused {again.reuse}"
    alone2 = cold(cairn, model, ids=edited, max_tokens=6, args=("--ctx", str(CTX)))
    assert (again.ids, again.lps) == (alone2.ids, alone2.lps), "the checkpoint taken in a joint call is not exact"


def test_cancel_of_a_joined_prefill_leaves_the_others_exact(cairn, family_model):
    model = family_model.model
    short = decoder_ids(family_model)
    long = ids_of(family_model, 1000, 5)
    after = ids_of(family_model, 12, 6)
    e = Engine(cairn, model, "--ctx", str(CTX), "--slots", "2", "--kv-share", "0", env={"CAIRN_STEP_LOG": "1"})
    try:
        dec = e.submit("dec", ids=short, max_tokens=DEC_TOKENS, slot=0)
        while not dec.ids:                          # decoding: the long prompt's chunks all join its steps
            e.pump()
        lrep = e.submit("long", ids=long, max_tokens=8, slot=1)
        while lrep.accept is None:
            e.pump()
        seen = len(dec.ids)
        while len(dec.ids) == seen:                 # a token of the step that carried the first chunk
            e.pump()
        e.send(b"CANCEL long\n")
        e.collect("long")
        e.collect("dec")
        nxt = e.generate(after, 6, slot=1)          # the cancelled slot's next turn starts clean
    finally:
        e.close()
    steps = steps_of(e)
    fed = sum(s[3] for s in steps)
    assert any(s[0] == 1 and s[3] >= 1 for s in steps) and fed < len(long), f"no joint step cut short: {steps}"
    assert lrep.error == "CANCELLED" and lrep.ids == [], f"not cancelled mid-prefill: {lrep.error} {lrep.ids}"
    alone = cold(cairn, model, ids=short, max_tokens=DEC_TOKENS, args=("--ctx", str(CTX)))
    assert dec.error is None and (dec.ids, dec.lps) == (alone.ids, alone.lps), "the decoding slot differs"
    assert nxt.error is None and nxt.reuse == 0
    alone2 = cold(cairn, model, ids=after, max_tokens=6, args=("--ctx", str(CTX)))
    assert (nxt.ids, nxt.lps) == (alone2.ids, alone2.lps)


def test_a_grammar_request_prefilled_in_joint_steps_follows_its_grammar(cairn, family_model):
    """The long prompt's first token is sampled from the last row of a joint call through its
    grammar's mask; every later one from its own decode rows beside the other slot's."""
    model = family_model.model
    short, long = decoder_ids(family_model), ids_of(family_model, 700, 8)
    kw = dict(max_tokens=80, temperature=1, logprobs=0, extra=" seed=3", grammar=GBNF)
    e = Engine(cairn, model, "--ctx", str(CTX), "--slots", "2", "--kv-share", "0", env={"CAIRN_STEP_LOG": "1"})
    try:
        dec = e.submit("dec", ids=short, max_tokens=DEC_TOKENS, slot=0)
        while not dec.ids:
            e.pump()
        g = e.submit("g", ids=long, slot=1, **kw)
        e.collect("g")
        e.collect("dec")
    finally:
        e.close()
    assert sum(s[3] for s in steps_of(e) if s[0] >= 1) == len(long), f"the prefill did not join: {steps_of(e)} {len(dec.ids)} {g.accept}"
    alone = cold(cairn, model, ids=long, args=("--ctx", str(CTX)), **kw)
    assert g.error is None and SHAPE.match(g.text.decode()), (g.error, g.text)
    assert g.text == alone.text
    ref = cold(cairn, model, ids=short, max_tokens=DEC_TOKENS, args=("--ctx", str(CTX)))
    assert (dec.ids, dec.lps) == (ref.ids, ref.lps)


def test_stop_of_a_joined_prefill_keeps_what_it_fed(cairn, family_model):
    """STOP during a joined prefill ends the request with DONE and no token; the slot keeps the
    prompt prefix the joint calls fed, recorded exactly, so the next turn extends it."""
    model = family_model.model
    short, long = decoder_ids(family_model), ids_of(family_model, 1000, 10)
    e = Engine(cairn, model, "--ctx", str(CTX), "--slots", "2", "--kv-share", "0", env={"CAIRN_STEP_LOG": "1"})
    try:
        dec = e.submit("dec", ids=short, max_tokens=DEC_TOKENS, slot=0)
        while not dec.ids:
            e.pump()
        lrep = e.submit("long", ids=long, max_tokens=8, slot=1)
        while lrep.accept is None:
            e.pump()
        seen = len(dec.ids)
        while len(dec.ids) == seen:                 # a token of a step that carried a chunk
            e.pump()
        e.send(b"STOP long\n")
        e.collect("long")
        e.collect("dec")
        again = e.generate(long, 6, slot=1)
    finally:
        e.close()
    fed = sum(s[3] for s in steps_of(e) if s[0] >= 1)
    assert lrep.error is None and lrep.ids == [] and lrep.completion == 0, (lrep.error, lrep.ids)
    assert 0 < fed and again.reuse == min(fed, len(long) - 1), f"fed {fed}, the next turn reused {again.reuse}"
    alone = cold(cairn, model, ids=long, max_tokens=6, args=("--ctx", str(CTX)))
    assert (again.ids, again.lps) == (alone.ids, alone.lps)
