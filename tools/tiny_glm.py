"""Small GLM-5 (`glm_moe_dsa`) checkpoints in the official Hugging Face layout, for tests and benches.

make(outdir, size, seed) writes config.json, model.safetensors (BF16 weights, F32 router bias, exactly
the tensor names GLM-5 ships), generation_config.json and a byte-level BPE tokenizer.json with the GLM
special tokens at the top of the vocabulary in the official order.

Sizes:
  tiny  — every code path in a few KB: dense layer 0 then MoE, MLA, a DSA indexer whose top-k (8)
          engages from the 9th token, indexer_types full/shared, interleaved RoPE in attention and
          indexer, non-zero e_score_correction_bias and k_norm.bias, one MTP layer.
  bench — the same shape scaled up for throughput measurements: its weights, and the bytes one decode
          token reads, exceed twice a server's last-level cache (see SIZES).

Weights are random but scaled so that activations keep unit size through the layers and the logits
spread over several nats (a near-uniform output would make agreement tests meaningless).

make(..., fp8=True) writes the GLM-5-FP8 layout instead: attention, indexer wq_b/wk, dense MLP and
expert matrices as F8_E4M3 with a `<name>_scale_inv` F32 scale per 128x128 block (amax / 448, so
arbitrary values, as the official checkpoint has); embeddings, lm_head, norms, router, eh_proj and
indexer weights_proj stay BF16.

make(..., quant="int4") writes colibri's GLM-5.2 int4 container (spec glm_kimi_inkling.md §1.3, §2.7):
each quantized matrix is a U8 tensor `<name>` [rows, bytes per row] of symmetric codes plus an F32
tensor `<name>.qs` of scales.
  - routed experts: int4 in groups of 64 inputs (QT format 4; value = nibble - 8, low nibble = even
    column, scale = group amax / 7);
  - every other matrix ("dense/resident": attention, indexer projections, dense MLP, shared expert,
    eh_proj, and also the embedding and lm_head, which §2.7 does not exempt and the engine keeps
    resident): int8 per row (format 1, amax / 127) or, with dense_bits=4, int4 per row (format 2);
  - norms, the router (mlp.gate.weight) and biases: F32, as §2.7 says.
Use size "tiny-wide" with it: "tiny" rows are at most 64 inputs, one group, where int4-g64 and
int4-per-row are the same layout, so only wider rows exercise the grouped format.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import tokjson  # noqa: E402

# GLM special tokens in the official tokenizer's order (GLM-5: <|endoftext|> = 154820, <|user|> = +7,
# <|observation|> = +9); placed at the top of the tiny vocabulary with the same relative offsets.
GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
                "<|begin_of_video|>", "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>",
                "<|begin_of_transcription|>", "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>",
                "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
                "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>"]

SIZES = {
    "tiny": dict(vocab_size=1024, hidden_size=64, num_hidden_layers=4, first_k_dense_replace=1,
                 intermediate_size=96, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=16,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=32, index_n_heads=2, index_head_dim=16,
                 index_topk=8, indexer_types=["full", "shared", "full", "shared"]),
    # tiny with 128 inputs per expert gate/up row (two int4 groups) and 96 per down row (one full,
    # one partial group).
    "tiny-wide": dict(vocab_size=1024, hidden_size=128, num_hidden_layers=4, first_k_dense_replace=1,
                      intermediate_size=96, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=16,
                      qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=96, index_n_heads=2, index_head_dim=16,
                      index_topk=8, indexer_types=["full", "shared", "full", "shared"]),
    # ~1.9 GB, ~0.7 GB read per decode token: both over twice a 260 MiB last-level cache, so decode
    # streams from memory (a model whose token fits in the LLC measures the cache, not bandwidth).
    "bench": dict(vocab_size=4096, hidden_size=2048, num_hidden_layers=8, first_k_dense_replace=1,
                  intermediate_size=4096, num_attention_heads=16, q_lora_rank=768, kv_lora_rank=512,
                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=16,
                  num_experts_per_tok=4, moe_intermediate_size=1024, index_n_heads=8, index_head_dim=128,
                  index_topk=64, indexer_types=["full", "shared", "shared", "full", "shared", "shared", "full",
                                                "shared"]),
}


def special_base(vocab):
    return vocab - 64


def config_for(size):
    c = dict(SIZES[size])
    base = special_base(c["vocab_size"])
    c.update({
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "dtype": "bfloat16",
        "num_key_value_heads": c["num_attention_heads"], "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_interleave": True, "indexer_rope_interleave": True, "attention_bias": False,
        "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "pad_token_id": base, "eos_token_id": [base, base + 7, base + 9],
    })
    return c


# Matrices GLM-5-FP8 keeps in BF16 (matched on the name's end).
FP8_KEEP_BF16 = ("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight", "eh_proj.weight",
                 "indexer.weights_proj.weight")
ROUTER = "mlp.gate.weight"


def fp8_blocks(w):
    """[out, in] -> (E4M3 codes, F32 scale per 128x128 block = block amax / 448)."""
    rows, cols = w.shape
    scale = np.zeros((-(-rows // 128), -(-cols // 128)), dtype=np.float32)
    q = np.zeros(w.shape, dtype=np.uint8)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            scale[i, j] = max(float(np.abs(blk).max()), 1e-12) / 448.0
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = st.e4m3_encode(blk / float(scale[i, j]))
    return q, scale


def int_codes(w, bits, group):
    """Symmetric codes of [out, in] with one F32 scale per row (group None) or per `group` inputs:
    int8 in [-127, 127] (amax / 127), int4 in [-8, 7] (amax / 7). Returns (codes, scales [out, n])."""
    rows, cols = w.shape
    width = group or cols
    n = -(-cols // width)
    padded = np.zeros((rows, n * width))
    padded[:, :cols] = w
    g = padded.reshape(rows, n, width)
    top = 127 if bits == 8 else 7
    scale = (np.maximum(np.abs(g).max(axis=2), 1e-12) / top).astype(np.float32)
    q = np.clip(np.rint(g / scale[..., None].astype(np.float64)), -top - (bits == 4), top)
    return q.reshape(rows, n * width)[:, :cols].astype(np.int64), scale


def int_container(w, bits, group=None):
    """colibri U8 bytes [out, bytes per row] and the `.qs` scales (flattened per row)."""
    q, scale = int_codes(w, bits, group)
    if bits == 8:
        return q.astype(np.int8).view(np.uint8), scale.reshape(-1)
    nib = (q + 8).astype(np.uint8)
    if nib.shape[1] % 2:
        nib = np.concatenate([nib, np.full((nib.shape[0], 1), 8, dtype=np.uint8)], axis=1)
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8), scale.reshape(-1)


class Weights:
    """Collects tensors in file order; matrices are BF16 (or block FP8, or colibri int containers)
    like the official and quantized checkpoints."""

    def __init__(self, seed, fp8=False, quant=None, dense_bits=8):
        self.rng = np.random.default_rng(seed)
        self.fp8, self.quant, self.dense_bits = fp8, quant, dense_bits
        self.t = {}

    def mat(self, name, rows, cols, gain=1.0):
        self.put(name, self.rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols)))

    def put(self, name, w):
        rows, cols = w.shape
        if self.fp8 and not name.endswith(FP8_KEEP_BF16):
            q, scale = fp8_blocks(w)
            self.t[name] = ("F8_E4M3", [rows, cols], q.tobytes())
            self.t[name + "_scale_inv"] = scale
        elif self.quant and name.endswith(ROUTER):
            self.t[name] = w.astype(np.float32)
        elif self.quant:
            routed = ".mlp.experts." in name
            codes, scale = int_container(w, 4 if routed else self.dense_bits, 64 if routed else None)
            self.t[name] = codes
            self.t[name + ".qs"] = scale
        else:
            self.t[name] = ("BF16", [rows, cols], st.bf16_bytes(w))

    def vec(self, name, n, mean=1.0, spread=0.1, dtype="BF16"):
        v = mean + spread * self.rng.standard_normal(n)
        if self.quant:
            dtype = "F32"
        self.t[name] = (dtype, [n], st.bf16_bytes(v) if dtype == "BF16" else v.astype(np.float32).tobytes())


def attention(w, p, c, full_indexer):
    d, h = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    w.mat(p + "q_a_proj.weight", c["q_lora_rank"], d)
    w.vec(p + "q_a_layernorm.weight", c["q_lora_rank"])
    w.mat(p + "q_b_proj.weight", h * qk, c["q_lora_rank"], gain=2.0)
    w.mat(p + "kv_a_proj_with_mqa.weight", c["kv_lora_rank"] + c["qk_rope_head_dim"], d)
    w.vec(p + "kv_a_layernorm.weight", c["kv_lora_rank"])
    w.mat(p + "kv_b_proj.weight", h * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"], gain=2.0)
    w.mat(p + "o_proj.weight", d, h * c["v_head_dim"], gain=0.7)
    if full_indexer:
        ihd = c["index_head_dim"]
        w.mat(p + "indexer.wq_b.weight", c["index_n_heads"] * ihd, c["q_lora_rank"], gain=2.0)
        w.mat(p + "indexer.wk.weight", ihd, d, gain=2.0)
        w.vec(p + "indexer.k_norm.weight", ihd)
        w.vec(p + "indexer.k_norm.bias", ihd, mean=0.0, spread=0.2)
        w.mat(p + "indexer.weights_proj.weight", c["index_n_heads"], d, gain=2.0)


def mlp(w, p, d, inter):
    w.mat(p + "gate_proj.weight", inter, d)
    w.mat(p + "up_proj.weight", inter, d)
    w.mat(p + "down_proj.weight", d, inter, gain=0.7)


def moe(w, p, c):
    d, e = c["hidden_size"], c["n_routed_experts"]
    w.mat(p + "gate.weight", e, d, gain=2.0)
    w.vec(p + "gate.e_score_correction_bias", e, mean=0.0, spread=0.2, dtype="F32")
    for i in range(e):
        mlp(w, f"{p}experts.{i}.", d, c["moe_intermediate_size"])
    mlp(w, p + "shared_experts.", d, c["moe_intermediate_size"] * c["n_shared_experts"])


def decoder_layer(w, i, c, full_indexer, sparse):
    p = f"model.layers.{i}."
    w.vec(p + "input_layernorm.weight", c["hidden_size"])
    w.vec(p + "post_attention_layernorm.weight", c["hidden_size"])
    attention(w, p + "self_attn.", c, full_indexer)
    if sparse:
        moe(w, p + "mlp.", c)
    else:
        mlp(w, p + "mlp.", c["hidden_size"], c["intermediate_size"])


def weights_for(c, seed, fp8, quant, dense_bits):
    w = Weights(seed, fp8, quant, dense_bits)
    d, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    embed = w.rng.standard_normal((v, d))
    if fp8:
        w.t["model.embed_tokens.weight"] = ("BF16", [v, d], st.bf16_bytes(embed))
    else:
        w.put("model.embed_tokens.weight", embed)
    for i in range(n):
        decoder_layer(w, i, c, c["indexer_types"][i] == "full", i >= c["first_k_dense_replace"])
    # The MTP layer sits at index num_hidden_layers (DeepSeek-V3 style), with its own full indexer.
    decoder_layer(w, n, c, True, True)
    p = f"model.layers.{n}."
    w.mat(p + "eh_proj.weight", d, 2 * d)
    w.vec(p + "enorm.weight", d)
    w.vec(p + "hnorm.weight", d)
    w.vec(p + "shared_head.norm.weight", d)
    w.vec("model.norm.weight", d)
    w.mat("lm_head.weight", v, d, gain=4.0)
    return w.t


def make(outdir, size="tiny", seed=1234, fp8=False, quant=None, dense_bits=8):
    if quant not in (None, "int4") or dense_bits not in (4, 8) or (fp8 and quant):
        raise ValueError(f"unsupported layout: fp8={fp8} quant={quant} dense_bits={dense_bits}")
    c = config_for(size)
    if fp8:
        c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128]}
    os.makedirs(outdir, exist_ok=True)
    st.write_file(os.path.join(outdir, "model.safetensors"), weights_for(c, seed, fp8, quant, dense_bits),
                  {"format": "pt"})
    base = special_base(c["vocab_size"])
    tokjson.build(os.path.join(outdir, "tokenizer.json"), c["vocab_size"],
                  [(base + i, s) for i, s in enumerate(GLM_SPECIALS)], "glm", seed)
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": c["eos_token_id"], "pad_token_id": c["pad_token_id"]}, f, indent=1)
    # config.json last: the test fixtures treat it as the "model complete" stamp.
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
