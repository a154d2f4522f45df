"""Small Inkling checkpoints (Hugging Face transformers `models/inkling`, InklingForConditionalGeneration,
model_type `inkling_mm_model`) for tests and benches.

make(outdir, size, seed, layout) writes config.json (text keys under `text_config`, audio under
`audio_config`, as configuration_inkling.py reads them), model.safetensors (BF16 matrices, F32
convolutions as `_keep_in_fp32_modules_strict` keeps them), generation_config.json and a byte-level
BPE tokenizer.json (o200k pre-tokenizer) with the Inkling message/content markers.

Layouts (the same weights either way, so tests can compare them):
  hf  — the transformers names: model.language_model.layers.L.self_attn.q_proj.weight, experts as
        3-D `experts.gate_up_proj` [E, 2I, D] (all gate rows, then all up rows), shared experts as
        separate gate_proj/up_proj [ns, I, D];
  raw — the released checkpoint's names: model.llm.layers.L.attn.wq_du.weight, mlp.w13_dn (dense),
        experts.w13_weight / shared_experts.shared_w13_weight with gate and up rows INTERLEAVED
        [g0, u0, g1, u1, ...], gate.bias for the score correction, model.llm.unembed for lm_head,
        model.audio.encoder / model.audio.final_norm for the audio embedding.

NVFP4 (nvfp4=True, `make_tiny.py inkling OUT --nvfp4`): every projection of the decoder layers
(attention q/k/v/r/o, the dense MLP, routed and shared experts) as NVFP4 — E2M1 codes, one E4M3
scale per 16 inputs, one f32 global scale per matrix (per expert in a stack); the embedding, head,
router and audio embedding stay BF16. The hf layout writes compressed-tensors' names
(`<w>_packed`, `<w>_scale`, `<w>_global_scale`, which the weights are divided by), the raw layout
ModelOpt's (`<w>` U8, `<w>_scale`, `<w>_scale_2`, multiplied), so both conventions are exercised.

Sizes:
  tiny  — every code path in a few hundred KB: 6 layers (default pattern: 0-4 sliding, 5 global),
          sliding window 6 (so prompts of ~20 tokens wrap the ring), relative-logit extent 12 on the
          global layer, log scaling from position 4, sliding layers with their own head shape, a dense
          first layer then MoE with 2 shared experts, lm_head padded past unpadded_vocab_size, and
          the 80-bin x 16-level DMel audio embedding.
  bench — the same shape scaled up (a few hundred MB) for throughput measurements.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import tokjson  # noqa: E402

# Message/content markers (vLLM's Inkling renderer, HF processing_inkling.py); the tiny vocabulary
# puts them just below unpadded_vocab_size.
INKLING_SPECIALS = ["<|endoftext|>", "<|message_system|>", "<|message_user|>", "<|message_model|>",
                    "<|message_tool|>", "<|content_text|>", "<|content_thinking|>", "<|content_xml|>",
                    "<|content_invoke_tool_json|>", "<|content_model_end_sampling|>", "<|end_message|>",
                    "<|content_image|>", "<|content_audio_input|>", "<|content_audio|>", "<|audio_end|>"]

SIZES = {
    "tiny": dict(vocab_size=1024, unpadded_vocab_size=1000, hidden_size=64, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 swa_num_attention_heads=4, swa_num_key_value_heads=1, swa_head_dim=8, sliding_window_size=6,
                 d_rel=4, rel_extent=12, log_scaling_n_floor=4, intermediate_size=96, moe_intermediate_size=32,
                 n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2),
    # ~1.1 B parameters (2.3 GB BF16): the real layer structure at 1/3 width, 64 experts.
    "bench": dict(vocab_size=8192, unpadded_vocab_size=8000, hidden_size=2048, num_hidden_layers=6,
                  num_attention_heads=16, num_key_value_heads=2, head_dim=128,
                  swa_num_attention_heads=16, swa_num_key_value_heads=4, swa_head_dim=128,
                  sliding_window_size=128, d_rel=16, rel_extent=512, log_scaling_n_floor=256,
                  intermediate_size=4096, moe_intermediate_size=512, n_routed_experts=64, num_experts_per_tok=6,
                  n_shared_experts=2),
}
N_MEL_BINS, MEL_VOCAB = 80, 16


def special_base(c):
    return c["unpadded_vocab_size"] - 32


def config_for(size):
    t = dict(SIZES[size])
    base = special_base(t)
    ids = {s: base + i for i, s in enumerate(INKLING_SPECIALS)}
    t.update({"model_type": "inkling_text", "hidden_act": "silu", "rms_norm_eps": 1e-6, "log_scaling_alpha": 0.1,
              "sconv_kernel_size": 4, "dense_mlp_idx": 1, "route_scale": 8.0, "shared_expert_sink": True,
              "logits_mup_width_multiplier": 24.0, "max_position_embeddings": 4096,
              "pad_token_id": ids["<|endoftext|>"],
              "eos_token_id": [ids["<|content_model_end_sampling|>"], ids["<|endoftext|>"]]})
    return {"architectures": ["InklingForConditionalGeneration"], "model_type": "inkling_mm_model",
            "dtype": "bfloat16", "text_config": t,
            "audio_config": {"model_type": "inkling_audio", "n_mel_bins": N_MEL_BINS, "mel_vocab_size": MEL_VOCAB},
            "audio_token_id": ids["<|content_audio|>"], "audio_bos_token_id": ids["<|content_audio_input|>"],
            "image_token_id": ids["<|content_image|>"], "tie_word_embeddings": False}


def canonical_weights(c, seed):
    """(HF text-model-relative name, float32 array) in file order, scaled so activations stay near
    unit size through the layers and the logits spread over several nats. A generator, so the
    bench size is encoded tensor by tensor instead of held in full precision."""
    rng = np.random.default_rng(seed)
    t = c["text_config"]
    d, k = t["hidden_size"], t["sconv_kernel_size"]

    def normal(shape):
        return rng.standard_normal(shape, dtype=np.float32)

    def mat(name, rows, cols, gain=1.0):
        return name, normal((rows, cols)) * np.float32(gain / np.sqrt(cols))

    def vec(name, n, mean=1.0, spread=0.1):
        return name, np.float32(mean) + np.float32(spread) * normal(n)

    def conv(name, ch):
        # depthwise [C, 1, K]; small taps: the residual inside the conv keeps x itself
        return name, np.float32(0.3) * normal((ch, 1, k))

    yield "embed_tokens.weight", normal((t["vocab_size"], d))
    yield vec("embed_tokens.embed_norm.weight", d)
    for i in range(t["num_hidden_layers"]):
        p = f"layers.{i}."
        sliding = (i + 1) % 6 != 0
        h = t["swa_num_attention_heads"] if sliding else t["num_attention_heads"]
        kv = t["swa_num_key_value_heads"] if sliding else t["num_key_value_heads"]
        hd = t["swa_head_dim"] if sliding else t["head_dim"]
        extent = t["sliding_window_size"] if sliding else t["rel_extent"]
        yield vec(p + "input_layernorm.weight", d)
        yield vec(p + "post_attention_layernorm.weight", d)
        a = p + "self_attn."
        yield mat(a + "q_proj.weight", h * hd, d)
        yield mat(a + "k_proj.weight", kv * hd, d)
        yield mat(a + "v_proj.weight", kv * hd, d)
        yield mat(a + "r_proj.weight", h * t["d_rel"], d)
        yield mat(a + "o_proj.weight", d, h * hd, gain=0.7)
        yield conv(a + "k_sconv.conv1d.weight", kv * hd)
        yield conv(a + "v_sconv.conv1d.weight", kv * hd)
        yield vec(a + "q_norm.weight", hd)
        yield vec(a + "k_norm.weight", hd)
        yield a + "rel_logits_proj.proj", normal((t["d_rel"], extent)) * np.float32(2.0 / np.sqrt(t["d_rel"]))
        yield conv(p + "attn_sconv.conv1d.weight", d)
        yield conv(p + "mlp_sconv.conv1d.weight", d)
        m = p + "mlp."
        if i < t["dense_mlp_idx"]:
            yield mat(m + "gate_proj.weight", t["intermediate_size"], d)
            yield mat(m + "up_proj.weight", t["intermediate_size"], d)
            yield mat(m + "down_proj.weight", d, t["intermediate_size"], gain=0.7)
            yield vec(m + "global_scale", 1, mean=0.9)
            continue
        e, ns, mi = t["n_routed_experts"], t["n_shared_experts"], t["moe_intermediate_size"]
        yield mat(m + "gate.weight", e + ns, d, gain=2.0)
        yield vec(m + "gate.global_scale", 1, mean=0.12, spread=0.01)
        yield vec(m + "gate.e_score_correction_bias", e, mean=0.0, spread=0.2)
        yield m + "experts.gate_up_proj", normal((e, 2 * mi, d)) * np.float32(1 / np.sqrt(d))
        yield m + "experts.down_proj", normal((e, d, mi)) * np.float32(0.7 / np.sqrt(mi))
        yield m + "shared_experts.gate_proj", normal((ns, mi, d)) * np.float32(1 / np.sqrt(d))
        yield m + "shared_experts.up_proj", normal((ns, mi, d)) * np.float32(1 / np.sqrt(d))
        yield m + "shared_experts.down_proj", normal((ns, d, mi)) * np.float32(0.7 / np.sqrt(mi))
    yield vec("norm.weight", d)
    yield mat("lm_head.weight", t["vocab_size"], d, gain=4.0 * t["logits_mup_width_multiplier"])
    yield "audio.embed", normal((N_MEL_BINS * MEL_VOCAB, d)) * np.float32(0.3)
    yield vec("audio.norm", d)


def interleave(gate, up, axis):
    """[g0, u0, g1, u1, ...] along axis: the released checkpoint's fused gate/up row order."""
    out = np.empty(gate.shape[:axis] + (2 * gate.shape[axis],) + gate.shape[axis + 1:], dtype=gate.dtype)
    idx = [slice(None)] * gate.ndim
    idx[axis] = slice(0, None, 2)
    out[tuple(idx)] = gate
    idx[axis] = slice(1, None, 2)
    out[tuple(idx)] = up
    return out


def hf_name(name):
    if name == "lm_head.weight":
        return name
    if name == "audio.embed":
        return "model.audio_tower.embed_audio_tokens.embed_audio_tokens.weight"
    if name == "audio.norm":
        return "model.audio_tower.norm.weight"
    return "model.language_model." + name


RAW_RENAMES = [("self_attn.q_proj", "attn.wq_du"), ("self_attn.k_proj", "attn.wk_dv"), ("self_attn.v_proj", "attn.wv_dv"),
               ("self_attn.r_proj", "attn.wr_du"), ("self_attn.o_proj", "attn.wo_ud"),
               ("self_attn.k_sconv.conv1d", "attn.k_sconv"), ("self_attn.v_sconv.conv1d", "attn.v_sconv"),
               ("attn_sconv.conv1d", "attn_sconv"), ("mlp_sconv.conv1d", "mlp_sconv"), ("self_attn.", "attn."),
               ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm"),
               ("gate.e_score_correction_bias", "gate.bias")]


def raw_tensors(w):
    """The released layout: renamed, fused gate/up interleaved."""
    out = {}
    for name, v in w.items():
        if name.endswith(("mlp.up_proj.weight", "mlp.down_proj.weight", "shared_experts.up_proj", "experts.down_proj")):
            continue
        p = name.rsplit(".", 2)[0] + "." if name.endswith("weight") else None
        if name.endswith("mlp.gate_proj.weight"):
            out["model.llm." + p + "w13_dn.weight"] = interleave(v, w[p + "up_proj.weight"], 0)
            out["model.llm." + p + "w2_md.weight"] = w[p + "down_proj.weight"]
            continue
        if name.endswith("experts.gate_up_proj") and "shared" not in name:
            p = name[: -len("gate_up_proj")]
            mi = v.shape[1] // 2
            out["model.llm." + p + "w13_weight"] = interleave(v[:, :mi], v[:, mi:], 1)
            out["model.llm." + p + "w2_weight"] = w[p + "down_proj"]
            continue
        if name.endswith("shared_experts.gate_proj"):
            p = name[: -len("gate_proj")]
            out["model.llm." + p + "shared_w13_weight"] = interleave(v, w[p + "up_proj"], 1)
            out["model.llm." + p + "shared_w2_weight"] = w[p + "down_proj"]
            continue
        if name == "embed_tokens.weight":
            out["model.llm.embed.weight"] = v
        elif name == "embed_tokens.embed_norm.weight":
            out["model.llm.embed_norm.weight"] = v
        elif name == "norm.weight":
            out["model.llm.norm.weight"] = v
        elif name == "lm_head.weight":
            out["model.llm.unembed.weight"] = v
        elif name == "audio.embed":
            out["model.audio.encoder.weight"] = v
        elif name == "audio.norm":
            out["model.audio.final_norm.weight"] = v
        else:
            for a, b in RAW_RENAMES:
                name = name.replace(a, b)
            out["model.llm." + name] = v
    return out


# The decoder-layer projections (hf and raw names) that an NVFP4 checkpoint quantizes.
NVFP4_MATRICES = ("_proj.weight", "experts.gate_up_proj", "experts.down_proj", "shared_experts.gate_proj",
                  "shared_experts.up_proj", "shared_experts.down_proj", "attn.wq_du.weight", "attn.wk_dv.weight",
                  "attn.wv_dv.weight", "attn.wr_du.weight", "attn.wo_ud.weight", "mlp.w13_dn.weight",
                  "mlp.w2_md.weight", "experts.w13_weight", "experts.w2_weight", "shared_w13_weight",
                  "shared_w2_weight")


def nvfp4_tensors(name, v, divides):
    """One matrix [R, C] or stack [E, R, C] as NVFP4 tensors: compressed-tensors names (divides) or
    ModelOpt names."""
    stack = v.reshape((-1,) + v.shape[-2:])
    parts = [st.nvfp4_quantize_weight(m, divides) for m in stack]
    packed = np.stack([p for p, _, _ in parts]).reshape(v.shape[:-1] + (v.shape[-1] // 2,))
    scale = np.stack([s for _, s, _ in parts]).reshape(v.shape[:-1] + (v.shape[-1] // 16,))
    g = np.array([g for _, _, g in parts], dtype=np.float32)
    return {name + "_packed" if divides else name: packed,
            name + "_scale": ("F8_E4M3", list(scale.shape), scale.tobytes()),
            name + ("_global_scale" if divides else "_scale_2"): g if v.ndim == 3 else ("F32", [], g.tobytes())}


def encode(tensors, nvfp4=None):
    """BF16 everywhere except the F32 convolutions, router score bias and scale scalars, and with
    nvfp4 ("ct" or "modelopt") the decoder projections as NVFP4; one tensor at a time, so only the
    encoded bytes stay in memory."""
    out = {}
    for name, v in tensors:
        if "sconv" in name or name.endswith(("global_scale", "e_score_correction_bias", "gate.bias")):
            out[name] = v.astype(np.float32)
        elif nvfp4 and ".layers." in name and name.endswith(NVFP4_MATRICES):
            out.update(nvfp4_tensors(name, v, nvfp4 == "ct"))
        else:
            out[name] = ("BF16", list(v.shape), st.bf16_bytes(v))
    return out


def quantization_config(layout):
    """What an NVFP4 checkpoint's config.json says of itself (compressed-tensors for the hf
    layout, ModelOpt for the raw one; cairn reads the tensors, not this)."""
    if layout == "hf":
        return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                "ignore": ["lm_head", "re:.*mlp.gate$"],
                "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
                                              "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                          "group_size": 16, "symmetric": True}}}}
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
            "exclude_modules": ["model.llm.unembed", "*mlp.gate"]}


def make(outdir, size="tiny", seed=1234, layout="hf", nvfp4=False):
    if layout not in ("hf", "raw"):
        raise ValueError(f"layout {layout!r}: hf or raw")
    c = config_for(size)
    if nvfp4:
        c["quantization_config"] = quantization_config(layout)
    w = canonical_weights(c, seed)
    tensors = ((hf_name(k), v) for k, v in w) if layout == "hf" else raw_tensors(dict(w)).items()
    os.makedirs(outdir, exist_ok=True)
    quant = ("ct" if layout == "hf" else "modelopt") if nvfp4 else None
    st.write_file(os.path.join(outdir, "model.safetensors"), encode(tensors, quant), {"format": "pt"})
    t = c["text_config"]
    base = special_base(t)
    # the tokenizer covers the unpadded vocabulary only: rows past it are lm_head/embedding padding
    tokjson.build(os.path.join(outdir, "tokenizer.json"), t["unpadded_vocab_size"],
                  [(base + i, s) for i, s in enumerate(INKLING_SPECIALS)], "inkling", seed)
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": t["eos_token_id"], "pad_token_id": t["pad_token_id"]}, f, indent=1)
    # config.json last: the test fixtures treat it as the "model complete" stamp.
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
