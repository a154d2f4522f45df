"""`cairn bench concurrency` on the tiny model of every family. The bench decodes 1, 2, 4 and 8
conversations in one forward call per step and fails unless each conversation's tokens equal
running it alone; it also says where the steps' time went: the dense products and the MoE
layers' expert calls are both timed (their timers fire: a rate of 0 means one did not) and leave
the rest of the steps' time as a share in [0, 1). No speed is asserted: `make bench` reports the
figures on the bench models."""
import json
import math
import subprocess


def test_bench_concurrency_reports_where_the_steps_go(cairn, family_model):
    r = subprocess.run([cairn, "bench", "concurrency", "-m", family_model.model, "--decode", "6", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for k in (2, 4, 8):
        assert math.isfinite(out[f"concurrency_ratio_{k}"]) and out[f"concurrency_ratio_{k}"] > 0
    assert out["experts_per_call_1"] >= 1     # every tiny model routes experts
    for k in (1, 4):
        assert out[f"dense_gbs_{k}"] > 0 and math.isfinite(out[f"dense_gbs_{k}"])
        assert out[f"experts_gbs_{k}"] > 0 and math.isfinite(out[f"experts_gbs_{k}"])
        assert 0 <= out[f"other_share_{k}"] < 1, out
