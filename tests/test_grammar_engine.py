"""Constrained decoding in `cairn engine` (the SUBMIT extension payload is a GBNF grammar), on the
tiny model of every family: output follows the grammar; a bad grammar is a BAD_REQUEST naming the
problem and the engine keeps serving; grammar state is per request, never part of the slot's
state, so a constrained turn records exactly the ids it fed and the next turn reuses them like any
other, token for token equal to a cold engine."""
import re

from engine_client import Engine, cold

CTX = 512
GBNF = b'root ::= "{\\"n\\": " [0-9]{1,3} ", \\"w\\": \\"" [a-z\\u00e9]{0,6} "\\"}"'
SHAPE = re.compile(r'^\{"n": [0-9]{1,3}, "w": "[a-zé]{0,6}"\}$')


def words(fam, seed, n):
    import random
    r = random.Random(seed)
    return [r.randrange(20, fam.ordinary_hi) for _ in range(n)]


def test_caps_announce_grammar(cairn, family_model):
    e = Engine(cairn, family_model.model, "--ctx", str(CTX))
    caps = dict(kv.split("=", 1) for kv in e.caps.split()[1:])
    assert caps["grammar"] == "1"
    assert e.close() == 0


def test_output_follows_the_grammar(cairn, family_model):
    e = Engine(cairn, family_model.model, "--ctx", str(CTX))
    seen = set()
    for seed in range(1, 41):
        r = e.generate(ids=words(family_model, seed, 6), max_tokens=80, temperature=1, logprobs=0,
                       extra=f" seed={seed}", grammar=GBNF)
        assert r.error is None and not r.length_limited, (r.error, r.text)
        text = r.text.decode()
        assert SHAPE.match(text), text
        seen.add(text)
    assert len(seen) > 5, "seeded sampling should explore the grammar"
    assert e.close() == 0


def test_bad_grammar_is_refused_and_the_engine_keeps_serving(cairn, family_model):
    e = Engine(cairn, family_model.model, "--ctx", str(CTX))
    prompt = words(family_model, 1, 5)
    for bad, why in [(b"root ::= nothere", "'nothere' is used but never defined"),
                     (b'root ::= "a', "unterminated string literal"),
                     (b"x ::= \"a\"", "no 'root' rule"),
                     (b'root ::= root "a"', "left-recursive"),
                     (b'root ::= "\x00"', "NUL byte")]:
        r = e.generate(ids=prompt, max_tokens=4, grammar=bad)
        assert r.error and r.error.startswith("BAD_REQUEST grammar:") and why in r.error, r.error
        assert r.accept is None
    ok = e.generate(ids=prompt, max_tokens=40, grammar=GBNF)
    assert ok.error is None and SHAPE.match(ok.text.decode())
    assert e.close() == 0


def test_constrained_turn_records_exactly_the_ids_fed(cairn, family_model):
    """Greedy under a grammar: the logprobs channel's top-1 is the chosen (masked) token, so the
    ids read back are the ids fed. The next turn extends them and must reuse all of them."""
    e = Engine(cairn, family_model.model, "--ctx", str(CTX))
    prompt = words(family_model, 7, 9)
    t1 = e.generate(ids=prompt, max_tokens=60, grammar=GBNF)
    assert SHAPE.match(t1.text.decode()) and not t1.length_limited
    # unconstrained greedy would not have written this: the grammar really steered the turn
    free = cold(cairn, family_model.model, ids=prompt, max_tokens=len(t1.ids), args=("--ctx", str(CTX)))
    assert free.ids != t1.ids
    turn2 = prompt + t1.fed() + words(family_model, 8, 4)
    t2 = e.generate(ids=turn2, max_tokens=8)
    assert t2.reuse == len(prompt) + len(t1.fed())
    ref = cold(cairn, family_model.model, ids=turn2, max_tokens=8, args=("--ctx", str(CTX)))
    assert t2.ids == ref.ids and t2.text == ref.text
    # and a constrained turn after it follows its own fresh grammar state, again exactly reused
    turn3 = turn2 + t2.fed() + words(family_model, 9, 3)
    t3 = e.generate(ids=turn3, max_tokens=60, grammar=GBNF)
    assert t3.reuse == len(turn2) + len(t2.fed()) and SHAPE.match(t3.text.decode())
    ref3 = cold(cairn, family_model.model, ids=turn3, max_tokens=60, args=("--ctx", str(CTX)), grammar=GBNF)
    assert t3.ids == ref3.ids
    assert e.close() == 0
