"""`cairn bench grammar` runs on the tiny model of every family and reports each constraint; the
per-state mask cache must actually answer steps (the optimisation fires). No timing is asserted:
`make bench` reports the figures on the bench models."""
import json
import math
import subprocess


def test_bench_grammar_reports_every_constraint(cairn, family_model):
    r = subprocess.run([cairn, "bench", "grammar", "-m", family_model.model, "--steps", "48", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    names = [c["name"] for c in out["constraints"]]
    # tool_call is measured for families whose template declares a tool-call syntax
    assert names in (["json_object", "json_schema", "tool_call"], ["json_object", "json_schema"])
    for c in out["constraints"]:
        assert math.isfinite(c["step_ratio"]) and c["step_ratio"] > 0
    # inside a free JSON object the matcher revisits states: most masks come from the cache
    assert out["constraints"][0]["cache_hit_rate"] > 0.5


def test_bench_grammar_flags(cairn, family_model):
    r = subprocess.run([cairn, "bench", "grammar", "-m", family_model.model, "--steps", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "--steps" in r.stderr
    r = subprocess.run([cairn, "bench", "grammar"], capture_output=True, text=True)
    assert r.returncode == 2 and "-m DIR is required" in r.stderr
