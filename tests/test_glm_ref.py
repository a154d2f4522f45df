"""GLM-5 forward pass (src/models/glm*.c) against the independent float64 reference tools/ref/glm.py
on the tiny checkpoint: exact numerics agree on every prompt position (top-1 equal, top-5 log-probs
within 0.002), the DSA top-k selection demonstrably shapes the result, default numerics round
activations to BF16, and how a prompt is split into forward calls never changes a bit. The same
agreement holds for the quantized layouts: GLM-5-FP8 (F32 block scales of any value) and colibri's
int4 container (int4-g64 routed experts, int8 or int4 per-row dense matrices, U8 + `.qs`)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, assert_agrees, echo

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
import glm as ref  # noqa: E402

BASE = 960  # tiny vocab: specials start at 1024 - 64 ([gMASK] = BASE + 2, <sop> = +4, <|user|> = +7, ...)
PROMPTS = {
    "short": [BASE + 2, BASE + 4, BASE + 7, 72, 105],
    "dsa": [BASE + 2, BASE + 4, BASE + 6, 100, 200, 300, 400, 500, 600, 700, 800, 900, 10, 20, 30, 40, BASE + 8],
    "long": [BASE + 2, BASE + 4, BASE + 7] + [(37 * i + 11) % 950 for i in range(36)] + [BASE + 8, BASE + 21],
}


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
    assert_agrees(got, lp)
    for pos, (row, want) in enumerate(zip(got, lp)):
        # The top-5 sets agree up to a near-tie at the 5th/6th place.
        best = ref.top_indices(want, 6)
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
                                         ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type"),
                                         ({"num_hidden_layers": 10_000_000}, "num_hidden_layers")])
def test_bad_config_is_refused_by_key(cairn, tiny_glm, tmp_path, change, key):
    copy_checkpoint(tiny_glm, tmp_path, config=change)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and key in r.stderr, r.stderr


def generated(dirname, **kwargs):
    """A tiny_glm variant under build/models, regenerated when tools/tiny_glm.py is newer."""
    out = os.path.join(ROOT, "build", "models", dirname)
    gen = os.path.join(ROOT, "tools", "tiny_glm.py")
    stamp = os.path.join(out, "config.json")
    if not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(gen):
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import tiny_glm
        tiny_glm.make(out, seed=1234, **kwargs)
    return out


@pytest.fixture(scope="module")
def tiny_glm_fp8():
    """The GLM-5-FP8 layout: F8_E4M3 matrices with F32 `_scale_inv` block scales."""
    return generated("glm-tiny-fp8-1234", size="tiny", fp8=True)


@pytest.fixture(scope="module", params=[8, 4], ids=["dense-int8", "dense-int4"])
def tiny_glm_int4(request):
    """colibri's int4 container: routed experts int4-g64, dense/resident matrices int8 (or int4) per row."""
    bits = request.param
    name = "glm-tiny-int4-1234" if bits == 8 else "glm-tiny-int4-dense4-1234"
    return generated(name, size="tiny-wide", quant="int4", dense_bits=bits)


def assert_matches_reference(cairn, model, ids, tensors_dir=None):
    assert_agrees(echo(cairn, model, ids)[0], ref_logprobs(ref.load(tensors_dir or model), ids))


def test_fp8_checkpoint_matches_reference(cairn, tiny_glm_fp8):
    cfg = json.load(open(os.path.join(tiny_glm_fp8, "config.json")))
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    tensors = st.read_file(os.path.join(tiny_glm_fp8, "model.safetensors"))
    scales = np.concatenate([np.frombuffer(raw, dtype=np.float32) for n, (dt, _, raw) in tensors.items()
                             if n.endswith("_scale_inv")])
    mant, _ = np.frexp(scales)
    assert len(scales) > 50 and np.mean(mant != 0.5) > 0.9, "block scales are powers of two: test would be blind"
    assert_matches_reference(cairn, tiny_glm_fp8, PROMPTS["dsa"])


def test_fp8_scaled_block_follows_the_scale(cairn, tiny_glm_fp8, tmp_path):
    """Multiplying one block's scale by 1.37 changes the output, and cairn follows the reference."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    tensors = st.read_file(os.path.join(tiny_glm_fp8, "model.safetensors"))
    name = "model.layers.2.self_attn.o_proj.weight_scale_inv"
    dt, shape, raw = tensors[name]
    tensors[name] = np.frombuffer(raw, dtype=np.float32).reshape(shape) * np.float32(1.37)
    copy_checkpoint(tiny_glm_fp8, tmp_path, tensors)
    ids = PROMPTS["short"]
    before, after = ref_logprobs(ref.load(tiny_glm_fp8), ids), ref_logprobs(ref.load(str(tmp_path)), ids)
    assert np.abs(before - after).max() > 0.01, "scale change invisible: test would be blind"
    assert_matches_reference(cairn, str(tmp_path), ids)


def test_fp8_bad_scale_is_refused(cairn, tiny_glm_fp8, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    tensors = st.read_file(os.path.join(tiny_glm_fp8, "model.safetensors"))
    name = "model.layers.2.self_attn.o_proj.weight_scale_inv"
    dt, shape, raw = tensors[name]
    bad = np.frombuffer(raw, dtype=np.float32).reshape(shape).copy()
    bad.flat[0] = np.nan
    tensors[name] = bad
    copy_checkpoint(tiny_glm_fp8, tmp_path, tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr and "not finite" in r.stderr, r.stderr


def test_int4_container_layout(tiny_glm_int4):
    """The container holds what §2.7 describes: U8 + F32 `.qs` pairs, experts in 64-input groups
    (two per row here), dense rows with one scale each, norms/router/bias F32, nothing BF16."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    cfg = json.load(open(os.path.join(tiny_glm_int4, "config.json")))
    tensors = st.read_file(os.path.join(tiny_glm_int4, "model.safetensors"))
    assert not [n for n, (dt, _, _) in tensors.items() if dt not in ("U8", "F32")]
    d, e_inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
    up = "model.layers.1.mlp.experts.3.up_proj.weight"
    assert tensors[up][0] == "U8" and tensors[up][1] == [e_inter, d // 2]
    assert tensors[up + ".qs"][1] == [e_inter * (d // 64)] and d // 64 == 2
    down = "model.layers.1.mlp.experts.3.down_proj.weight"
    assert tensors[down + ".qs"][1] == [d * -(-e_inter // 64)] and e_inter % 64 != 0
    o = "model.layers.0.self_attn.o_proj.weight"
    assert tensors[o + ".qs"][1] == [d]
    for name in ("model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                 "model.norm.weight", "model.layers.0.self_attn.indexer.k_norm.bias"):
        assert tensors[name][0] == "F32", name


def test_int4_container_matches_reference(cairn, tiny_glm_int4):
    assert_matches_reference(cairn, tiny_glm_int4, PROMPTS["long"])


def test_int4_container_prompt_split_is_bit_exact(cairn, tiny_glm_int4):
    ids = PROMPTS["long"]
    _, whole = echo(cairn, tiny_glm_int4, ids)
    for chunks in ("1", "3,5", "7,1,2"):
        _, split = echo(cairn, tiny_glm_int4, ids, "exact", ["--prefill-chunks", chunks])
        assert split == whole, f"--prefill-chunks {chunks} changed the output"


@pytest.mark.parametrize("damage", ["short", "scales", "no-scales"])
def test_int4_container_mismatch_is_refused_by_name(cairn, tmp_path, damage):
    """Codes and scales that fit no layout of the matrix, or a missing `.qs`, are named at load."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import st
    model = generated("glm-tiny-int4-1234", size="tiny-wide", quant="int4")
    tensors = st.read_file(os.path.join(model, "model.safetensors"))
    name = "model.layers.2.mlp.experts.5.down_proj.weight"
    dt, shape, raw = tensors[name]
    if damage == "short":
        tensors[name] = (dt, [shape[0] - 1, shape[1]], raw[: -shape[1]])
    elif damage == "scales":
        qs = np.frombuffer(tensors[name + ".qs"][2], dtype=np.float32)
        tensors[name + ".qs"] = qs[:-3].copy()
    else:
        del tensors[name + ".qs"]
    copy_checkpoint(model, tmp_path, tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr, r.stderr
    assert ("missing" if damage == "no-scales" else "match no quantized layout") in r.stderr, r.stderr

