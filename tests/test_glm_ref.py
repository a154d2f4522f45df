"""GLM-5 forward pass (src/models/glm*.c) against the independent float64 reference tools/ref/glm.py
on the tiny checkpoint: exact numerics agree on every prompt position (top-1 equal, top-5 log-probs
within 0.002), the DSA top-k selection demonstrably shapes the result, default numerics round
activations to BF16, and how a prompt is split into forward calls never changes a bit."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
import glm as ref  # noqa: E402

BASE = 960  # tiny vocab: specials start at 1024 - 64 ([gMASK] = BASE + 2, <sop> = +4, <|user|> = +7, ...)
PROMPTS = {
    "short": [BASE + 2, BASE + 4, BASE + 7, 72, 105],
    "dsa": [BASE + 2, BASE + 4, BASE + 6, 100, 200, 300, 400, 500, 600, 700, 800, 900, 10, 20, 30, 40, BASE + 8],
    "long": [BASE + 2, BASE + 4, BASE + 7] + [(37 * i + 11) % 950 for i in range(36)] + [BASE + 8, BASE + 21],
}


def echo(cairn, model, ids, numerics="exact", extra=()):
    """cairn's next-token top-5 log-probs at every prompt position: [[(id, logprob)...]...]."""
    r = subprocess.run([cairn, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "0",
                        "--numerics", numerics, "--echo-logprobs", "5", *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{"pos"')]
    assert [row["pos"] for row in rows] == list(range(len(ids))), r.stdout[:500]
    return [[(t["id"], t["logprob"]) for t in row["top"]] for row in rows], r.stdout


@pytest.fixture(scope="module")
def reference(tiny_glm):
    return ref.load(tiny_glm)


def ref_logprobs(reference, ids):
    cfg, w = reference
    return ref.log_softmax(ref.forward(cfg, w, ids))


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_exact_matches_reference(cairn, tiny_glm, reference, name):
    ids = PROMPTS[name]
    got, _ = echo(cairn, tiny_glm, ids)
    lp = ref_logprobs(reference, ids)
    for pos, (row, want) in enumerate(zip(got, lp)):
        best = ref.top_indices(want, 6)
        assert row[0][0] == best[0], f"pos {pos}: top-1 {row[0][0]} != reference {best[0]}"
        for tid, val in row:
            assert abs(val - want[tid]) <= 0.002, f"pos {pos} id {tid}: {val} vs reference {want[tid]}"
        # The top-5 sets agree up to a near-tie at the 5th/6th place.
        assert set(t for t, _ in row) <= set(int(t) for t in best), f"pos {pos}: {row} vs {best}"


def test_outputs_are_peaked(reference):
    """The tiny weights must give confident, well-separated predictions, or agreement means little."""
    lp = ref_logprobs(reference, PROMPTS["long"])
    top = np.sort(lp, axis=1)[:, ::-1]
    assert np.median(top[:, 0]) > -2.0, "near-uniform outputs"
    assert np.median(top[:, 0] - top[:, 1]) > 0.2, "top-1 margins too small"


def test_dsa_selection_shapes_the_output(cairn, tiny_glm, reference):
    """Past index_topk positions the indexer drops keys: the reference without DSA differs, and cairn
    follows the reference with DSA. Before index_topk both are the same dense attention."""
    cfg, w = reference
    ids = PROMPTS["long"]
    dense_cfg = dict(cfg, index_topk=10 ** 6)
    dense = ref.log_softmax(ref.forward(dense_cfg, w, ids))
    sparse = ref_logprobs(reference, ids)
    k = cfg["index_topk"]
    assert np.abs(dense[:k] - sparse[:k]).max() < 1e-9
    assert np.abs(dense[k:] - sparse[k:]).max() > 0.05, "DSA selection changed nothing: test would be blind"
    got, _ = echo(cairn, tiny_glm, ids)
    last = dict(got[-1])
    top = int(ref.top_indices(sparse[-1], 1)[0])
    assert abs(last[top] - sparse[-1][top]) <= 0.002


def test_default_numerics_round_to_bf16(cairn, tiny_glm, reference):
    """Default numerics hold activations in BF16: close to the f32 reference, but not equal. (Short
    prompt: on long ones a rounding-induced flip of a discrete expert/DSA choice moves logits more.)"""
    ids = PROMPTS["short"]
    exact, _ = echo(cairn, tiny_glm, ids, "exact")
    qat, _ = echo(cairn, tiny_glm, ids, "qat")
    lp = ref_logprobs(reference, ids)
    diffs = [abs(v - lp[p][t]) for p, row in enumerate(qat) for t, v in row]
    assert max(diffs) > 1e-4, "qat numerics identical to f32: BF16 rounding did not happen"
    assert np.median(diffs) < 0.05 and max(diffs) < 0.5, f"BF16 activations drifted too far: {max(diffs)}"
    assert [r[0][0] for r in exact] == [r[0][0] for r in qat]


@pytest.mark.parametrize("numerics", ["exact", "qat"])
def test_prompt_split_is_bit_exact(cairn, tiny_glm, numerics):
    """The same prompt fed in forward calls of different sizes (crossing index_topk) gives identical bytes."""
    ids = PROMPTS["long"]
    _, whole = echo(cairn, tiny_glm, ids, numerics)
    for chunks in ("1", "3,5", "7,1,2", "8"):
        _, split = echo(cairn, tiny_glm, ids, numerics, ["--prefill-chunks", chunks])
        assert split == whole, f"--prefill-chunks {chunks} changed the output"


def test_bad_token_id_is_refused(cairn, tiny_glm):
    r = subprocess.run([cairn, "run", "-m", tiny_glm, "--prompt-ids", "1,2,99999", "-n", "1"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "99999" in r.stderr


def copy_checkpoint(src, dst, tensors=None, config=None):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    if tensors is None:
        with open(os.path.join(src, "model.safetensors"), "rb") as a, open(os.path.join(dst, "model.safetensors"), "wb") as b:
            b.write(a.read())
    else:
        st.write_file(os.path.join(dst, "model.safetensors"), tensors)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(config or {})
    cfg = {k: v for k, v in cfg.items() if v is not None}
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    with open(os.path.join(src, "tokenizer.json"), "rb") as a, open(os.path.join(dst, "tokenizer.json"), "wb") as b:
        b.write(a.read())


@pytest.mark.parametrize("name", ["model.layers.1.self_attn.kv_b_proj.weight", "model.layers.4.eh_proj.weight"])
def test_broken_tensor_is_refused_by_name(cairn, tiny_glm, tmp_path, name):
    """A tensor with the wrong shape (also in the MTP layer, which is validated) is named; nothing crashes."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    tensors = st.read_file(os.path.join(tiny_glm, "model.safetensors"))
    dt, shape, raw = tensors[name]
    tensors[name] = (dt, [shape[0] // 2, shape[1]], raw[: len(raw) // 2])
    copy_checkpoint(tiny_glm, tmp_path, tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr, r.stderr


@pytest.mark.parametrize("change, key", [({"n_group": 8}, "n_group"), ({"kv_lora_rank": None}, "kv_lora_rank"),
                                         ({"indexer_types": ["full", "sometimes", "full", "shared"]}, "indexer_types[1]"),
                                         ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
                                         ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type")])
def test_bad_config_is_refused_by_key(cairn, tiny_glm, tmp_path, change, key):
    copy_checkpoint(tiny_glm, tmp_path, config=change)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and key in r.stderr, r.stderr


@pytest.fixture(scope="module")
def tiny_glm_fp8():
    """The GLM-5-FP8 layout: F8_E4M3 matrices with F32 `_scale_inv` block scales."""
    out = os.path.join(ROOT, "build", "models", "glm-tiny-fp8-1234")
    gen = os.path.join(ROOT, "tools", "tiny_glm.py")
    stamp = os.path.join(out, "config.json")
    if not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(gen):
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import tiny_glm
        tiny_glm.make(out, "tiny", 1234, fp8=True)
    return out


def test_fp8_checkpoint_matches_reference(cairn, tiny_glm_fp8):
    cfg = json.load(open(os.path.join(tiny_glm_fp8, "config.json")))
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    ids = PROMPTS["dsa"]
    got, _ = echo(cairn, tiny_glm_fp8, ids)
    lp = ref_logprobs(ref.load(tiny_glm_fp8), ids)
    for pos, (row, want) in enumerate(zip(got, lp)):
        assert row[0][0] == ref.top_indices(want, 1)[0], f"pos {pos}"
        assert max(abs(v - want[t]) for t, v in row) <= 0.002, f"pos {pos}"


def test_fp8_scale_that_is_not_a_power_of_two_is_refused(cairn, tiny_glm_fp8, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    tensors = st.read_file(os.path.join(tiny_glm_fp8, "model.safetensors"))
    name = "model.layers.2.self_attn.o_proj.weight_scale_inv"
    dt, shape, raw = tensors[name]
    tensors[name] = np.frombuffer(raw, dtype=np.float32).reshape(shape) * np.float32(1.5)
    copy_checkpoint(tiny_glm_fp8, tmp_path, tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr and "power of two" in r.stderr, r.stderr
