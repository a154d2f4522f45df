"""Small Kimi K3 checkpoints in the official release layout, for tests and benches.

make(outdir, size, seed) writes what moonshotai/Kimi-K3 ships, scaled down:
  - config.json: root `model_type: kimi_k3` with a `text_config` of `model_type: kimi_linear`
    (the published field names: linear_attn_config, attn_res_block_size, activation_situ_*,
    routed_expert_hidden_size, num_experts_per_token, moe_renormalize, ...);
  - model.safetensors (or a sharded index with shard_bytes): tensor names with the
    `language_model.` prefix, dtypes as the release keeps them (BF16 matrices and norms; F32 A_log,
    dt_bias, short convs, o_norm and router bias; routed experts MXFP4 `weight_packed` U8 with low
    nibble = even column + `weight_scale` U8 UE8M0 per 32 inputs); layer 0's unused
    self_attention_res_* is present as in the release; A_log is zero-padded past num_heads;
  - tokenizer.json: byte-level BPE with the K3 special tokens ([BOS], [EOS], <|end_of_msg|>,
    <|open|>, <|close|>, <|sep|>, ...) at the top of the vocabulary in the official order.

Sizes:
  tiny  — 5 layers (KDA 1-3, gated NoPE MLA 4-5, 1-based as the config lists them), dense layer 0,
          attention-residual blocks at layers 0/2/4, 8 experts top-2 in a 32-wide latent.
  bench — the same structure scaled up for throughput measurements.
make(..., prefix="") writes the names without `language_model.` (both are accepted).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import tokjson  # noqa: E402

# K3's special tokens from [BOS] = 163584 in the official order; the tiny vocabulary keeps their
# relative offsets from its own base.
K3_SPECIALS = ["[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>", "[start_header_id]",
               "[end_header_id]", "[reserved_8]", "[EOT]"]

SIZES = {
    "tiny": dict(vocab_size=1024, hidden_size=64, num_hidden_layers=5, intermediate_size=96,
                 num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                 qk_rope_head_dim=8, v_head_dim=16, num_experts=8, num_experts_per_token=2,
                 num_shared_experts=2, moe_intermediate_size=32, routed_expert_hidden_size=32,
                 attn_res_block_size=2, kda_heads=2, kda_head_dim=16),
    # ~1 GB: the dense KDA projections and the MXFP4 experts dominate, as in the release.
    "bench": dict(vocab_size=4096, hidden_size=2048, num_hidden_layers=8, intermediate_size=4096,
                  num_attention_heads=16, q_lora_rank=512, kv_lora_rank=256, qk_nope_head_dim=64,
                  qk_rope_head_dim=32, v_head_dim=64, num_experts=32, num_experts_per_token=4,
                  num_shared_experts=2, moe_intermediate_size=1024, routed_expert_hidden_size=1024,
                  attn_res_block_size=4, kda_heads=16, kda_head_dim=128),
}


def special_base(vocab):
    return vocab - 64


def config_for(size):
    s = dict(SIZES[size])
    n = s["num_hidden_layers"]
    # Every 4th layer and the last are MLA (1-based), the rest KDA: K3's published schedule.
    full = [i for i in range(1, n + 1) if i % 4 == 0 or i == n]
    kda = [i for i in range(1, n + 1) if i not in full]
    base = special_base(s["vocab_size"])
    text = {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "dtype": "bfloat16",
        "vocab_size": s["vocab_size"], "hidden_size": s["hidden_size"], "num_hidden_layers": n,
        "intermediate_size": s["intermediate_size"], "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_attention_heads": s["num_attention_heads"], "num_key_value_heads": s["num_attention_heads"],
        "q_lora_rank": s["q_lora_rank"], "kv_lora_rank": s["kv_lora_rank"],
        "qk_nope_head_dim": s["qk_nope_head_dim"], "qk_rope_head_dim": s["qk_rope_head_dim"],
        "v_head_dim": s["v_head_dim"], "mla_use_nope": True, "mla_use_output_gate": True,
        "num_experts": s["num_experts"], "num_experts_per_token": s["num_experts_per_token"],
        "num_shared_experts": s["num_shared_experts"], "moe_intermediate_size": s["moe_intermediate_size"],
        "routed_expert_hidden_size": s["routed_expert_hidden_size"], "latent_moe_use_norm": True,
        "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc",
        "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
        "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "attn_res_block_size": s["attn_res_block_size"], "rms_norm_eps": 1e-5,
        "linear_attn_config": {"num_heads": s["kda_heads"], "head_dim": s["kda_head_dim"],
                               "short_conv_kernel_size": 4, "gate_lower_bound": -5.0, "use_full_rank_gate": True,
                               "kda_layers": kda, "full_attn_layers": full},
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
        "bos_token_id": base, "eos_token_id": base + 2, "pad_token_id": base + 63,
        "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                                "ignore": ["re:.*shared_experts.*"],
                                "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                                                              "weights": {"num_bits": 4, "group_size": 32}}}},
    }
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "bos_token_id": base, "eos_token_id": base + 2, "pad_token_id": base + 63,
            "tie_word_embeddings": False, "text_config": text}


class Weights:
    def __init__(self, seed, prefix):
        self.rng = np.random.default_rng(seed)
        self.prefix = prefix
        self.t = {}

    def mat(self, name, rows, cols, gain=1.0):
        w = self.rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))
        self.t[self.prefix + name] = ("BF16", [rows, cols], st.bf16_bytes(w))

    def vec(self, name, n, mean=1.0, spread=0.1, dtype="BF16", shape=None):
        v = mean + spread * self.rng.standard_normal(n)
        raw = st.bf16_bytes(v) if dtype == "BF16" else v.astype(np.float32).tobytes()
        self.t[self.prefix + name] = (dtype, shape or [n], raw)

    def f32(self, name, v, shape=None):
        v = np.asarray(v, dtype=np.float32)
        self.t[self.prefix + name] = ("F32", shape or list(v.shape), v.tobytes())

    def mxfp4(self, name, rows, cols, gain=1.0):
        w = self.rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))
        packed, scale = st.fp4_quantize_weight(w)
        self.t[self.prefix + name + ".weight_packed"] = packed.view(np.uint8)
        self.t[self.prefix + name + ".weight_scale"] = scale


def kda(w, p, c):
    la = c["linear_attn_config"]
    d, h, hd, k = c["hidden_size"], la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    proj = h * hd
    for name in ("q", "k", "v"):
        w.mat(p + f"{name}_proj.weight", proj, d, gain=2.0 if name != "v" else 1.0)
        # Depthwise causal conv [P, 1, K]; the current token's tap (last) dominates.
        taps = 0.3 * w.rng.standard_normal((proj, 1, k))
        taps[:, 0, -1] += 1.0
        w.f32(p + f"{name}_conv1d.weight", taps)
    w.mat(p + "f_a_proj.weight", hd, d)
    w.mat(p + "f_b_proj.weight", proj, hd, gain=2.0)
    w.mat(p + "b_proj.weight", h, d, gain=2.0)
    w.mat(p + "g_proj.weight", proj, d, gain=2.0)
    w.f32(p + "o_norm.weight", 1.0 + 0.1 * w.rng.standard_normal(hd))
    w.mat(p + "o_proj.weight", d, proj, gain=0.8)
    # A_log as the release stores it: padded to a multiple of 4 past num_heads with zeros.
    a_log = np.zeros(h + 2)
    a_log[:h] = np.log(w.rng.uniform(1.0, 16.0, h))
    w.f32(p + "A_log", a_log)
    w.f32(p + "dt_bias", 0.5 * w.rng.standard_normal(proj))


def mla(w, p, c):
    d, h = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    w.mat(p + "q_a_proj.weight", c["q_lora_rank"], d)
    w.vec(p + "q_a_layernorm.weight", c["q_lora_rank"])
    w.mat(p + "q_b_proj.weight", h * qk, c["q_lora_rank"], gain=2.0)
    w.mat(p + "kv_a_proj_with_mqa.weight", c["kv_lora_rank"] + c["qk_rope_head_dim"], d, gain=2.0)
    w.vec(p + "kv_a_layernorm.weight", c["kv_lora_rank"])
    w.mat(p + "kv_b_proj.weight", h * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"], gain=2.0)
    w.mat(p + "g_proj.weight", h * c["v_head_dim"], d, gain=2.0)
    w.mat(p + "o_proj.weight", d, h * c["v_head_dim"], gain=0.8)


def glu(w, p, d, inter):
    w.mat(p + "gate_proj.weight", inter, d, gain=2.0)
    w.mat(p + "up_proj.weight", inter, d, gain=2.0)
    w.mat(p + "down_proj.weight", d, inter, gain=0.7)


def moe(w, p, c):
    d, e, lat, inter = c["hidden_size"], c["num_experts"], c["routed_expert_hidden_size"], c["moe_intermediate_size"]
    w.mat(p + "gate.weight", e, d, gain=1.0)
    w.vec(p + "gate.e_score_correction_bias", e, mean=0.0, spread=0.2, dtype="F32")
    w.mat(p + "routed_expert_down_proj.weight", lat, d)
    w.vec(p + "routed_expert_norm.weight", lat)
    w.mat(p + "routed_expert_up_proj.weight", d, lat, gain=0.7)
    for i in range(e):
        w.mxfp4(f"{p}experts.{i}.w1", inter, lat, gain=1.5)
        w.mxfp4(f"{p}experts.{i}.w2", lat, inter)
        w.mxfp4(f"{p}experts.{i}.w3", inter, lat, gain=1.5)
    glu(w, p + "shared_experts.", d, inter * c["num_shared_experts"])


def weights_for(c, seed, prefix):
    w = Weights(seed, prefix)
    d, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    w.mat("model.embed_tokens.weight", v, d, gain=np.sqrt(d))
    kda_layers = set(c["linear_attn_config"]["kda_layers"])
    for i in range(n):
        p = f"model.layers.{i}."
        w.vec(p + "input_layernorm.weight", d)
        w.vec(p + "post_attention_layernorm.weight", d)
        for site in ("self_attention_res", "mlp_res"):
            w.vec(p + f"{site}_norm.weight", d)
            w.vec(p + f"{site}_proj.weight", d, mean=0.0, spread=2.0 / np.sqrt(d), shape=[1, d])
        (kda if i + 1 in kda_layers else mla)(w, p + "self_attn.", c)
        if i >= c["first_k_dense_replace"]:
            moe(w, p + "block_sparse_moe.", c)
        else:
            glu(w, p + "mlp.", d, c["intermediate_size"])
    w.vec("model.output_attn_res_norm.weight", d)
    w.vec("model.output_attn_res_proj.weight", d, mean=0.0, spread=2.0 / np.sqrt(d), shape=[1, d])
    w.vec("model.norm.weight", d)
    w.mat("lm_head.weight", v, d, gain=4.0)
    return w.t


def make(outdir, size="tiny", seed=1234, prefix="language_model.", shard_bytes=None):
    c = config_for(size)
    text = c["text_config"]
    os.makedirs(outdir, exist_ok=True)
    tensors = weights_for(text, seed, prefix)
    if shard_bytes:
        st.write_sharded(outdir, tensors, shard_bytes)
    else:
        st.write_file(os.path.join(outdir, "model.safetensors"), tensors, {"format": "pt"})
    base = special_base(text["vocab_size"])
    tokjson.build(os.path.join(outdir, "tokenizer.json"), text["vocab_size"],
                  [(base + i, s) for i, s in enumerate(K3_SPECIALS)], "glm", seed)
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": c["eos_token_id"], "bos_token_id": c["bos_token_id"]}, f, indent=1)
    # config.json last: the test fixtures treat it as the "model complete" stamp.
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
