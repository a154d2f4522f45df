"""Inkling forward pass (src/models/inkling*.c) against the independent float64 reference
tools/ref/inkling.py on the tiny checkpoint, in both the Hugging Face and the released raw layout:
exact numerics agree on every prompt position, including prompts past the sliding window, the
relative-logit extent and the log-scaling floor (each shown to change the result, so the test is
not blind to them); default numerics round activations to BF16; the prompt split never changes a
bit; audio placeholders fed DMel frames through the engine match the reference with the same
frames; bad tensors and config values are refused by name."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, assert_agrees, echo
from engine_client import Engine

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import inkling as ref  # noqa: E402
import tiny_inkling  # noqa: E402

BASE = 968  # tiny specials: endoftext, message_system, message_user, message_model, ... (tiny_inkling.py)
SYS, USER, MODEL, TEXT, END = BASE + 1, BASE + 2, BASE + 3, BASE + 5, BASE + 10
AUDIO_IN, AUDIO, AUDIO_END = BASE + 12, BASE + 13, BASE + 14
PROMPTS = {
    "short": [USER, TEXT, 72, 105, 33],
    "window": [SYS, TEXT] + [(37 * i + 11) % 950 for i in range(9)] + [END, USER, TEXT, 5, END, MODEL],
    "long": [SYS, TEXT] + [(53 * i + 7) % 950 for i in range(30)] + [END, USER, TEXT, 44, 55, END, MODEL],
}


def generated(name, **kw):
    out = os.path.join(ROOT, "build", "models", name)
    gen = os.path.join(ROOT, "tools", "tiny_inkling.py")
    stamp = os.path.join(out, "config.json")
    if not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(gen):
        tiny_inkling.make(out, seed=1234, **kw)
    return out


@pytest.fixture(scope="module")
def tiny():
    return generated("inkling-tiny-1234")


@pytest.fixture(scope="module")
def tiny_raw():
    return generated("inkling-tiny-raw-1234", layout="raw")


@pytest.fixture(scope="module")
def reference(tiny):
    return ref.load(tiny)


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_exact_matches_reference(cairn, tiny, reference, name):
    ids = PROMPTS[name]
    got, _ = echo(cairn, tiny, ids)
    assert_agrees(got, ref.log_softmax(ref.forward(*reference, ids)))


def test_outputs_are_peaked(reference):
    lp = ref.log_softmax(ref.forward(*reference, PROMPTS["long"]))
    top = np.sort(lp, axis=1)[:, ::-1]
    assert np.median(top[:, 0]) > -2.0, "near-uniform outputs"
    assert np.median(top[:, 0] - top[:, 1]) > 0.2, "top-1 margins too small"


def widen_profiles(w, width, new):
    """Zero-pad relative-logit banks of `width` distances to `new` (a bias of 0 beyond, as before)."""
    w = dict(w)
    for k in [k for k in w if k.endswith("rel_logits_proj.proj") and w[k].shape[1] == width]:
        w[k] = np.concatenate([w[k], np.zeros((w[k].shape[0], new - width))], axis=1)
    return w


def no_window(cfg, w):
    t = cfg["text_config"]
    return dict(cfg, text_config=dict(t, sliding_window_size=10 ** 4)), widen_profiles(w, t["sliding_window_size"], 10 ** 4)


def no_relative_bias(cfg, w):
    return cfg, {k: (0 * v if k.endswith("rel_logits_proj.proj") else v) for k, v in w.items()}


def no_log_scaling(cfg, w):
    return dict(cfg, text_config=dict(cfg["text_config"], log_scaling_n_floor=None)), w


@pytest.mark.parametrize("variant", [no_window, no_relative_bias, no_log_scaling])
def test_long_context_features_shape_the_output(reference, variant):
    """The window, the relative-position bias and log scaling each matter on the long prompt, so
    agreement there covers them."""
    ids = PROMPTS["long"]
    base = ref.log_softmax(ref.forward(*reference, ids))
    other = ref.log_softmax(ref.forward(*variant(*reference), ids))
    assert np.abs(other - base).max() > 0.05, f"{variant.__name__} changed nothing: agreement would be blind to it"


def test_raw_layout_is_bitwise_the_hf_layout(cairn, tiny, tiny_raw):
    """The released layout (renamed, gate/up rows interleaved) holds the same weights: same bytes out."""
    ids = PROMPTS["long"]
    assert echo(cairn, tiny_raw, ids)[1] == echo(cairn, tiny, ids)[1]
    assert_agrees(echo(cairn, tiny_raw, ids)[0], ref.log_softmax(ref.forward(*ref.load(tiny_raw), ids)))


def test_default_numerics_round_to_bf16(cairn, tiny, reference):
    """Default numerics hold activations in BF16: close to the f32 reference, not equal. (The tiny
    model's logits spread over ~10 nats, so a BF16 ulp of the residual stream moves log-probs by a
    few hundredths; a flipped expert choice moves them more.)"""
    ids = PROMPTS["window"]
    exact, _ = echo(cairn, tiny, ids, "exact")
    qat, _ = echo(cairn, tiny, ids, "qat")
    lp = ref.log_softmax(ref.forward(*reference, ids))
    diffs = [abs(v - lp[p][t]) for p, row in enumerate(qat) for t, v in row]
    assert max(diffs) > 1e-4, "qat numerics identical to f32: BF16 rounding did not happen"
    assert np.median(diffs) < 0.15 and max(diffs) < 2.0, f"BF16 activations drifted too far: {max(diffs)}"
    same = sum(a[0][0] == b[0][0] for a, b in zip(exact, qat))
    assert same >= 0.8 * len(ids), f"top-1 agrees on only {same}/{len(ids)} positions"


@pytest.mark.parametrize("numerics", ["exact", "qat"])
def test_prompt_split_is_bit_exact(cairn, tiny, numerics):
    """Forward calls of any size (across the window, where ring slots are overwritten) give the same bytes."""
    ids = PROMPTS["long"]
    _, whole = echo(cairn, tiny, ids, numerics)
    for chunks in ("1", "3,5", "7,1,2", "6"):
        _, split = echo(cairn, tiny, ids, numerics, ["--prefill-chunks", chunks])
        assert split == whole, f"--prefill-chunks {chunks} changed the output"


def dmel_frames(n, seed):
    return np.random.default_rng(seed).integers(0, 16, (n, 80)).astype(np.uint8)


def audio_prompt(frames):
    return [USER, AUDIO_IN] + [AUDIO] * frames + [AUDIO_END, END, USER, TEXT, 61, END, MODEL]


def test_audio_frames_match_reference(cairn, tiny, reference):
    """DMel frames sent as the SUBMIT extension payload replace the placeholder embeddings exactly
    as the reference's audio tower does (and different frames give a different answer)."""
    frames = dmel_frames(4, 3)
    ids = audio_prompt(4)
    e = Engine(cairn, tiny, "--numerics", "exact")
    try:
        got = e.generate(ids=ids, max_tokens=1, ext=frames.tobytes())
        other = e.generate(ids=ids, max_tokens=1, ext=dmel_frames(4, 4).tobytes())
    finally:
        e.close()
    assert got.done, got.error
    lp = ref.log_softmax(ref.forward(*reference, ids, frames))[-1]
    assert got.ids[0] == ref.top_indices(lp, 1)[0]
    assert abs(got.lps[0] - lp[got.ids[0]]) <= 0.002
    lp_other = ref.log_softmax(ref.forward(*reference, ids, dmel_frames(4, 4)))[-1]
    assert np.abs(lp - lp_other).max() > 0.05, "the audio frames do not matter: test would be blind"
    assert other.ids[0] == ref.top_indices(lp_other, 1)[0]


@pytest.mark.parametrize("frames,payload,expect", [
    (4, dmel_frames(3, 1).tobytes(), "3 frames for 4 placeholder"),
    (2, dmel_frames(2, 1).tobytes()[:-7], "whole number of 80-bin frames"),
    (2, bytes([16] * 160), "DMel level 16"),
])
def test_bad_audio_payload_is_refused_and_state_kept(cairn, tiny, frames, payload, expect):
    e = Engine(cairn, tiny)
    try:
        text = [USER, TEXT] + [(7 * i + 3) % 900 for i in range(8)] + [END, MODEL]
        first = e.generate(ids=text, max_tokens=3)
        bad = e.generate(ids=audio_prompt(frames), max_tokens=2, ext=payload)
        after = e.generate(ids=text + first.fed() + [USER, TEXT, 9, END, MODEL], max_tokens=3)
    finally:
        e.close()
    assert bad.error and bad.error.startswith("BAD_REQUEST") and expect in bad.error, bad.error
    assert after.reuse == len(text) + len(first.fed()), "a refused request disturbed the slot's state"


def copy_checkpoint(src, dst, tensors=None, text_change=None):
    import st
    if tensors is None:
        tensors = st.read_file(os.path.join(src, "model.safetensors"))
    st.write_file(os.path.join(dst, "model.safetensors"), tensors)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["text_config"].update(text_change or {})
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    with open(os.path.join(src, "tokenizer.json"), "rb") as a, open(os.path.join(dst, "tokenizer.json"), "wb") as b:
        b.write(a.read())


@pytest.mark.parametrize("name", ["model.language_model.layers.5.self_attn.rel_logits_proj.proj",
                                  "model.language_model.layers.2.mlp.experts.gate_up_proj",
                                  "model.language_model.layers.0.attn_sconv.conv1d.weight"])
def test_broken_tensor_is_refused_by_name(cairn, tiny, tmp_path, name):
    import st
    tensors = st.read_file(os.path.join(tiny, "model.safetensors"))
    dt, shape, raw = tensors[name]
    tensors[name] = (dt, [shape[0] // 2] + shape[1:], raw[: len(raw) // 2])
    copy_checkpoint(tiny, tmp_path, tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr, r.stderr


@pytest.mark.parametrize("change,key", [({"layer_types": ["hybrid_sliding"] * 5 + ["global"]}, "layer_types[5]"),
                                        ({"num_experts_per_tok": 99}, "num_experts_per_tok"),
                                        ({"log_scaling_n_floor": 0}, "log_scaling_n_floor"),
                                        ({"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types[1]"),
                                        ({"num_hidden_layers": 10_000_000}, "num_hidden_layers")])
def test_bad_config_is_refused_by_key(cairn, tiny, tmp_path, change, key):
    copy_checkpoint(tiny, tmp_path, text_change=change)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and key in r.stderr, r.stderr


def test_rewind_needs_the_conv_state(tiny):
    """Cutting the state of P back to its first 3 tokens and continuing with Q: rows (and the ring,
    P fits the window) alone leave the four short-conv windows holding P's later inputs and are off
    by whole nats; a snapshot taken at 3 (which carries the conv windows) continues bit for bit."""
    p = [USER, TEXT, 72, 105, 33, 44]
    q = [USER, TEXT, 72, 500, 600, END, MODEL]
    r = subprocess.run([os.path.join(ROOT, "build", "tests", "tool_inkling_rewind"), tiny, "3", ",".join(map(str, p)),
                        ",".join(map(str, q))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["snapshot_bitwise"] == 1 and d["snapshot"] == 0.0
    assert d["rows_only"] > 1.0, f"rows-only truncation off by only {d['rows_only']} nats: test would be blind"


# ---- NVFP4 (the release format of the main model) ---------------------------------------------

@pytest.fixture(scope="module")
def tiny_nvfp4():
    """hf layout, compressed-tensors names: the weights divided by weight_global_scale."""
    return generated("inkling-tiny-nvfp4-1234", nvfp4=True)


@pytest.fixture(scope="module")
def tiny_nvfp4_raw():
    """raw layout, ModelOpt names: the weights multiplied by weight_scale_2."""
    return generated("inkling-tiny-nvfp4-raw-1234", layout="raw", nvfp4=True)


@pytest.fixture(scope="module", params=["hf", "raw"])
def nvfp4_model(request, tiny_nvfp4, tiny_nvfp4_raw):
    return tiny_nvfp4 if request.param == "hf" else tiny_nvfp4_raw


@pytest.mark.parametrize("name", ["short", "long"])
def test_nvfp4_matches_reference(cairn, nvfp4_model, name):
    ids = PROMPTS[name]
    got, _ = echo(cairn, nvfp4_model, ids)
    assert_agrees(got, ref.log_softmax(ref.forward(*ref.load(nvfp4_model), ids)))


def test_nvfp4_is_read_as_nvfp4(cairn, tiny, tiny_nvfp4, tiny_nvfp4_raw):
    """The quantized checkpoints stream about half the BF16 bytes per token (4.5 bits per projection
    weight; the embedding row, head and router stay BF16), and their answers differ from the BF16
    model's by far more than the agreement tolerance: the reference agreement above is not the
    BF16 weights passing through."""
    def decode_bytes(model):
        r = subprocess.run([cairn, "run", "-m", model, "--weights-report", "0"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["decode_bytes"]
    bf16 = decode_bytes(tiny)
    for model in (tiny_nvfp4, tiny_nvfp4_raw):
        assert decode_bytes(model) < 0.6 * bf16
    ids = PROMPTS["long"]
    lp_bf16 = ref.log_softmax(ref.forward(*ref.load(tiny), ids))
    lp_nv = ref.log_softmax(ref.forward(*ref.load(tiny_nvfp4), ids))
    assert np.abs(lp_nv - lp_bf16).max() > 0.05, "NVFP4 rounding changed nothing: the test would be blind"


@pytest.mark.parametrize("numerics", ["exact", "qat"])
def test_nvfp4_prompt_split_is_bit_exact(cairn, tiny_nvfp4, numerics):
    """NVFP4 batched products (prefill) give the bytes of matrix x vector (decode)."""
    ids = PROMPTS["long"]
    _, whole = echo(cairn, tiny_nvfp4, ids, numerics)
    for chunks in ("1", "7,1,2"):
        _, split = echo(cairn, tiny_nvfp4, ids, numerics, ["--prefill-chunks", chunks])
        assert split == whole, f"--prefill-chunks {chunks} changed the output"


Q_HF = "model.language_model.layers.1.self_attn.q_proj.weight"
EXPERTS_HF = "model.language_model.layers.2.mlp.experts.gate_up_proj"
Q_RAW = "model.llm.layers.1.attn.wq_du.weight"
EXPERTS_RAW = "model.llm.layers.2.mlp.experts.w13_weight"


def halve_rows(t):
    dt, shape, raw = t
    return dt, [shape[0] // 2] + shape[1:], raw[: len(raw) // 2]


def as_f32(t):
    dt, shape, raw = t
    return "F32", shape, np.frombuffer(raw, dtype=np.uint8).astype(np.float32).tobytes()


def as_bf16(t):
    dt, shape, raw = t
    return "BF16", [1], raw[2:4]


def zero_scale(t):
    dt, shape, raw = t
    return dt, shape, bytes(len(raw))


@pytest.mark.parametrize("layout,name,change,expect", [
    ("hf", Q_HF + "_scale", halve_rows, "expected F8_E4M3 [32,4] (NVFP4 scales, one per 16 inputs), found F8_E4M3 [16,4]"),
    ("hf", Q_HF + "_scale", as_f32, "expected F8_E8M0 [32,2] (MXFP4) or F8_E4M3 [32,4] (NVFP4), found F32 [32,4]"),
    ("hf", Q_HF + "_global_scale", zero_scale, "not finite and positive"),
    ("hf", Q_HF + "_global_scale", None, "global scale"),
    ("hf", EXPERTS_HF + "_scale", halve_rows, "expected F8_E4M3 [8,64,4]"),
    ("hf", EXPERTS_HF + "_global_scale", halve_rows, "expected F32 [8]"),
    ("raw", Q_RAW + "_scale", halve_rows, "F8_E4M3 [32,4]"),
    ("raw", Q_RAW + "_scale_2", as_bf16, "expected F32 [1] (the NVFP4 global scale), found BF16 [1]"),
    ("raw", EXPERTS_RAW + "_scale", as_f32, "expected F8_E4M3 [8,64,4]"),
])
def test_nvfp4_bad_scale_is_refused_by_name(cairn, tiny_nvfp4, tiny_nvfp4_raw, tmp_path, layout, name, change,
                                            expect):
    import st
    src = tiny_nvfp4 if layout == "hf" else tiny_nvfp4_raw
    tensors = st.read_file(os.path.join(src, "model.safetensors"))
    if change is None:
        del tensors[name]
    else:
        tensors[name] = change(tensors[name])
    copy_checkpoint(src, tmp_path, tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr and expect in r.stderr, r.stderr
