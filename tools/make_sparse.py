"""make_sparse.py FAMILY OUT — a checkpoint with the real config, tensor names, dtypes and shapes,
written as sparse files: each shard gets its real JSON header and is then extended to its full
size without writing data, so a 160 GB (DeepSeek-V4-Flash) or 1.5 TB (GLM-5) checkpoint costs a
few MB of disk. Every weight reads as zero, except where an inventory row carries its bytes (a
4th element: NVFP4's global scales, which a loader rightly refuses as 0). The loader, the tensor validation of each family and
the memory behaviour of mmap can then be tested at full scale on an ordinary machine.

FAMILY is deepseek_v4 (DeepSeek-V4-Flash), glm (GLM-5, glm_moe_dsa, BF16 official layout), kimi_k3
(Kimi K3, the text model of the MXFP4 release), inkling (Inkling 975B, the released raw layout) or
inkling-hf (the same in the transformers names). Each inventory checks itself against the published
totals (tensor count and index total_size) where they are known here (no Inkling or K3 index was).
No tokenizer.json is written: the real vocabularies are not available here.
"""
import argparse
import glob
import json
import os
import struct
import sys

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}

# ---- DeepSeek-V4-Flash (deepseek_v4.md §1 config, §8 tensor list) ---------------------------

DSV4_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "vocab_size": 129280,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "n_routed_experts": 256,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "num_hash_layers": 3,
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "num_nextn_predict_layers": 1,
    "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    "torch_dtype": "bfloat16",
}
DSV4_TENSORS = 69187              # §8: 43x1565 + 41x4 + 21x7 + 6 + 1575
DSV4_TOTAL_SIZE = 159609485896    # §8: index metadata.total_size


def fp8_linear(out, name, rows, cols):
    """Dense FP8 weight: E4M3 codes plus one UE8M0 scale per 128x128 block."""
    out.append((f"{name}.weight", "F8_E4M3", [rows, cols]))
    out.append((f"{name}.scale", "F8_E8M0", [-(-rows // 128), -(-cols // 128)]))


def fp4_linear(out, name, rows, cols):
    """Routed expert: two E2M1 codes per I8 byte plus one UE8M0 scale per 32 inputs."""
    out.append((f"{name}.weight", "I8", [rows, cols // 2]))
    out.append((f"{name}.scale", "F8_E8M0", [rows, cols // 32]))


def dsv4_hc(out, p, c):
    hc, d = c["hc_mult"], c["hidden_size"]
    mix = (2 + hc) * hc
    out += [(f"{p}_fn", "F32", [mix, hc * d]), (f"{p}_base", "F32", [mix]), (f"{p}_scale", "F32", [3])]


def dsv4_hc_head(out, p, c):
    hc, d = c["hc_mult"], c["hidden_size"]
    out += [(f"{p}hc_head_fn", "F32", [hc, hc * d]), (f"{p}hc_head_base", "F32", [hc]),
            (f"{p}hc_head_scale", "F32", [1])]


def dsv4_compressor(out, p, ratio, width, d):
    coff = 2 if ratio == 4 else 1      # overlap (two series per token) is keyed on ratio == 4
    out += [(f"{p}.ape", "F32", [ratio, coff * width]), (f"{p}.norm.weight", "BF16", [width]),
            (f"{p}.wkv.weight", "BF16", [coff * width, d]), (f"{p}.wgate.weight", "BF16", [coff * width, d])]


def dsv4_attention(out, p, ratio, c):
    d, h, hd, ql = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    g, ol = c["o_groups"], c["o_lora_rank"]
    out += [(f"{p}.attn_sink", "F32", [h]), (f"{p}.q_norm.weight", "BF16", [ql]),
            (f"{p}.kv_norm.weight", "BF16", [hd])]
    fp8_linear(out, f"{p}.wq_a", ql, d)
    fp8_linear(out, f"{p}.wq_b", h * hd, ql)
    fp8_linear(out, f"{p}.wkv", hd, d)
    fp8_linear(out, f"{p}.wo_a", g * ol, h * hd // g)
    fp8_linear(out, f"{p}.wo_b", d, g * ol)
    if ratio:
        dsv4_compressor(out, f"{p}.compressor", ratio, hd, d)
    if ratio == 4:
        ih, idim = c["index_n_heads"], c["index_head_dim"]
        dsv4_compressor(out, f"{p}.indexer.compressor", ratio, idim, d)
        out.append((f"{p}.indexer.weights_proj.weight", "BF16", [ih, d]))
        fp8_linear(out, f"{p}.indexer.wq_b", ih * idim, ql)


def dsv4_moe(out, p, hash_routed, c):
    d, e, inter = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]
    out.append((f"{p}.gate.weight", "BF16", [e, d]))
    if hash_routed:
        out.append((f"{p}.gate.tid2eid", "I64", [c["vocab_size"], c["num_experts_per_tok"]]))
    else:
        out.append((f"{p}.gate.bias", "F32", [e]))
    shared = inter * c["n_shared_experts"]
    fp8_linear(out, f"{p}.shared_experts.w1", shared, d)
    fp8_linear(out, f"{p}.shared_experts.w2", d, shared)
    fp8_linear(out, f"{p}.shared_experts.w3", shared, d)
    for i in range(e):
        fp4_linear(out, f"{p}.experts.{i}.w1", inter, d)
        fp4_linear(out, f"{p}.experts.{i}.w2", d, inter)
        fp4_linear(out, f"{p}.experts.{i}.w3", inter, d)


def dsv4_block(out, p, ratio, hash_routed, c):
    d = c["hidden_size"]
    out += [(f"{p}.attn_norm.weight", "BF16", [d]), (f"{p}.ffn_norm.weight", "BF16", [d])]
    dsv4_hc(out, f"{p}.hc_attn", c)
    dsv4_hc(out, f"{p}.hc_ffn", c)
    dsv4_attention(out, f"{p}.attn", ratio, c)
    dsv4_moe(out, f"{p}.ffn", hash_routed, c)


def dsv4_inventory(c):
    d, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    out = [("embed.weight", "BF16", [v, d]), ("head.weight", "BF16", [v, d]), ("norm.weight", "BF16", [d])]
    dsv4_hc_head(out, "", c)
    for i in range(n):
        dsv4_block(out, f"layers.{i}", c["compress_ratios"][i], i < c["num_hash_layers"], c)
    for k in range(c["num_nextn_predict_layers"]):
        p = f"mtp.{k}"
        dsv4_block(out, p, c["compress_ratios"][n + k], False, c)
        fp8_linear(out, f"{p}.e_proj", d, d)
        fp8_linear(out, f"{p}.h_proj", d, d)
        out += [(f"{p}.{x}.weight", "BF16", [d]) for x in ("enorm", "hnorm", "norm")]
        dsv4_hc_head(out, f"{p}.", c)
    return out


# ---- GLM-5 (glm_kimi_inkling.md Corrections, §2.1, §2.2, §5) ---------------------------------
#
# Values follow the HF GlmMoeDsaConfig defaults listed in §5 and the published GLM-5.1 config.json
# (same architecture: 78 layers, first 3 dense, MTP at layer 78). Uncertain points:
#  - The inventory below is checked against the GLM-5.1 index (59,870 tensors, total_size
#    1,507,728,316,928 bytes); GLM-5 is assumed to ship the identical layout.
#  - dtypes: every tensor BF16 except mlp.gate.e_score_correction_bias (F32). A F32 router weight
#    (which some runtimes keep in F32 in memory) does not reproduce the published total; BF16 does.
#  - config.json fields beyond §5 (head_dim 64, pad_token_id, rope_parameters shape, dtype) are
#    taken from the GLM-5.1 release; GLM-5's file may differ in those informational fields.

GLM_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "dtype": "bfloat16",
    "vocab_size": 154880,
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "head_dim": 64,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "hidden_act": "silu",
    "max_position_embeddings": 202752,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "rope_interleave": True,
    "indexer_rope_interleave": True,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "num_nextn_predict_layers": 1,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "pad_token_id": 154820,
    "eos_token_id": [154820, 154827, 154829],
    "use_cache": True,
}
GLM_TENSORS = 59870
GLM_TOTAL_SIZE = 1507728316928


def glm_attention(out, p, c):
    d, h = c["hidden_size"], c["num_attention_heads"]
    ql, kvl, rope = c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    qk = c["qk_nope_head_dim"] + rope
    ih, idim = c["index_n_heads"], c["index_head_dim"]
    a = f"{p}.self_attn"
    out += [(f"{a}.q_a_proj.weight", "BF16", [ql, d]), (f"{a}.q_a_layernorm.weight", "BF16", [ql]),
            (f"{a}.q_b_proj.weight", "BF16", [h * qk, ql]),
            (f"{a}.kv_a_proj_with_mqa.weight", "BF16", [kvl + rope, d]),
            (f"{a}.kv_a_layernorm.weight", "BF16", [kvl]),
            (f"{a}.kv_b_proj.weight", "BF16", [h * (c["qk_nope_head_dim"] + c["v_head_dim"]), kvl]),
            (f"{a}.o_proj.weight", "BF16", [d, h * c["v_head_dim"]]),
            (f"{a}.indexer.wq_b.weight", "BF16", [ih * idim, ql]), (f"{a}.indexer.wk.weight", "BF16", [idim, d]),
            (f"{a}.indexer.k_norm.weight", "BF16", [idim]), (f"{a}.indexer.k_norm.bias", "BF16", [idim]),
            (f"{a}.indexer.weights_proj.weight", "BF16", [ih, d])]


def glm_swiglu(out, p, inter, d):
    out += [(f"{p}.gate_proj.weight", "BF16", [inter, d]), (f"{p}.up_proj.weight", "BF16", [inter, d]),
            (f"{p}.down_proj.weight", "BF16", [d, inter])]


def glm_layer(out, p, dense, c):
    d = c["hidden_size"]
    out += [(f"{p}.input_layernorm.weight", "BF16", [d]), (f"{p}.post_attention_layernorm.weight", "BF16", [d])]
    glm_attention(out, p, c)
    if dense:
        glm_swiglu(out, f"{p}.mlp", c["intermediate_size"], d)
        return
    e, inter = c["n_routed_experts"], c["moe_intermediate_size"]
    out += [(f"{p}.mlp.gate.weight", "BF16", [e, d]), (f"{p}.mlp.gate.e_score_correction_bias", "F32", [e])]
    glm_swiglu(out, f"{p}.mlp.shared_experts", inter * c["n_shared_experts"], d)
    for i in range(e):
        glm_swiglu(out, f"{p}.mlp.experts.{i}", inter, d)


def glm_inventory(c):
    d, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    out = [("model.embed_tokens.weight", "BF16", [v, d]), ("model.norm.weight", "BF16", [d]),
           ("lm_head.weight", "BF16", [v, d])]
    for i in range(n):
        glm_layer(out, f"model.layers.{i}", i < c["first_k_dense_replace"], c)
    for k in range(c["num_nextn_predict_layers"]):
        p = f"model.layers.{n + k}"
        glm_layer(out, p, False, c)
        out += [(f"{p}.eh_proj.weight", "BF16", [d, 2 * d]), (f"{p}.enorm.weight", "BF16", [d]),
                (f"{p}.hnorm.weight", "BF16", [d]), (f"{p}.shared_head.norm.weight", "BF16", [d])]
    return out


# ---- Inkling (HF transformers models/inkling configuration_inkling.py defaults) --------------
#
# The text config is configuration_inkling.py's InklingTextConfig defaults (66 layers, hidden 6144,
# 64/8/128 global and 64/16/128 sliding heads, window 512, d_rel 16, rel_extent 1024, 256 experts
# top-6 with 2 shared, moe 3072, dense 24576, vocab 201024) with unpadded_vocab_size 200058 (the
# config comment's "big model" value). Uncertain points:
#  - dense_mlp_idx: the HF default 0 (every layer MoE); 66 MoE layers + MTP give ~973B parameters,
#    the published "975B".
#  - log_scaling_n_floor: the HF default None (off); the released value is not known here.
#  - dtypes: the release is NVFP4 for the main model. Every projection of the 66 decoder layers
#    (attention q/k/v/r/o, routed and shared experts; a dense MLP if dense_mlp_idx > 0) is written
#    as NVFP4: E2M1 codes U8 [..., in/2], E4M3 scales [..., in/16] per 16 inputs, an F32 global per
#    matrix (per expert in a stack). The exact names of the release's NVFP4 tensors are not known
#    here: the raw layout takes ModelOpt's (`<w>` U8, `<w>_scale`, `<w>_scale_2`), which are the
#    names vLLM's fused-MoE NVFP4 loader gives `w13_weight` / `w2_weight`, and the hf layout
#    compressed-tensors' nvfp4-pack-quantized (`<w>_packed`, `<w>_scale`, `<w>_global_scale`). The
#    embedding, lm_head/unembed, router, norms, convolutions, relative-logit banks, the audio
#    embedding and the MTP block stay BF16 (F32 score-correction bias).
#  - the MTP block (model.mtp.layers.0..7, 20 tensors each, local_layer_ids [0,2,4,5,6,7]) is
#    written with the names a vLLM port lists; cairn, like HF, ignores model.mtp.*.
#  - audio tensor names in the raw layout (model.audio.encoder / final_norm) follow colibri.
#  - the vision tower is not written: its raw tensor names are not known here, and cairn takes no images.

INKLING_TEXT = {
    "model_type": "inkling_text", "vocab_size": 201024, "unpadded_vocab_size": 200058, "hidden_size": 6144,
    "num_hidden_layers": 66, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16, "swa_head_dim": 128,
    "sliding_window_size": 512, "d_rel": 16, "rel_extent": 1024, "log_scaling_n_floor": None,
    "log_scaling_alpha": 0.1, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sconv_kernel_size": 4,
    "intermediate_size": 3072, "dense_intermediate_size": 24576, "moe_intermediate_size": 3072,
    "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 2, "shared_expert_sink": True,
    "route_scale": 8.0, "logits_mup_width_multiplier": 24.0, "hidden_act": "silu", "dense_mlp_idx": 0,
    "bos_token_id": 1, "eos_token_id": 2,
}
INKLING_CONFIG = {
    "architectures": ["InklingForConditionalGeneration"], "model_type": "inkling_mm_model", "dtype": "bfloat16",
    "text_config": INKLING_TEXT,
    "audio_config": {"model_type": "inkling_audio", "n_mel_bins": 80, "mel_vocab_size": 16},
    "mtp_config": {"num_nextn_predict_layers": 8, "chain_hidden_post_norm": False, "local_layer_ids": [0, 2, 4, 5, 6, 7]},
    "image_token_id": 200007, "audio_token_id": 200021, "image_bos_token_id": 200005, "audio_bos_token_id": 200020,
    "tie_word_embeddings": False,
}


def inkling_attention(out, p, sliding, c, raw):
    d, pre = c["hidden_size"], "swa_" if sliding else ""
    h, kv, hd = c[pre + "num_attention_heads"], c[pre + "num_key_value_heads"], c[pre + "head_dim"]
    ext = c["sliding_window_size"] if sliding else c["rel_extent"]
    a, cv = (f"{p}.attn", "") if raw else (f"{p}.self_attn", ".conv1d")
    names = ("wq_du", "wk_dv", "wv_dv", "wr_du", "wo_ud") if raw else ("q_proj", "k_proj", "v_proj", "r_proj", "o_proj")
    shapes = ([h * hd, d], [kv * hd, d], [kv * hd, d], [h * c["d_rel"], d], [d, h * hd])
    out += [(f"{a}.{n}.weight", "BF16", s) for n, s in zip(names, shapes)]
    out += [(f"{a}.q_norm.weight", "BF16", [hd]), (f"{a}.k_norm.weight", "BF16", [hd]),
            (f"{a}.k_sconv{cv}.weight", "BF16", [kv * hd, 1, c["sconv_kernel_size"]]),
            (f"{a}.v_sconv{cv}.weight", "BF16", [kv * hd, 1, c["sconv_kernel_size"]]),
            (f"{a}.rel_logits_proj.proj", "BF16", [c["d_rel"], ext])]


def inkling_block(out, p, sliding, sparse, c, raw):
    d, k = c["hidden_size"], c["sconv_kernel_size"]
    cv = "" if raw else ".conv1d"
    norms = ("attn_norm", "mlp_norm") if raw else ("input_layernorm", "post_attention_layernorm")
    out += [(f"{p}.{norms[0]}.weight", "BF16", [d]), (f"{p}.{norms[1]}.weight", "BF16", [d]),
            (f"{p}.attn_sconv{cv}.weight", "BF16", [d, 1, k]), (f"{p}.mlp_sconv{cv}.weight", "BF16", [d, 1, k])]
    inkling_attention(out, p, sliding, c, raw)
    m = f"{p}.mlp"
    if not sparse:
        di = c["dense_intermediate_size"]
        out += [(f"{m}.global_scale", "BF16", [1])]
        out += ([(f"{m}.w13_dn.weight", "BF16", [2 * di, d]), (f"{m}.w2_md.weight", "BF16", [d, di])] if raw else
                [(f"{m}.gate_proj.weight", "BF16", [di, d]), (f"{m}.up_proj.weight", "BF16", [di, d]),
                 (f"{m}.down_proj.weight", "BF16", [d, di])])
        return
    e, ns, mi = c["n_routed_experts"], c["n_shared_experts"], c["moe_intermediate_size"]
    out += [(f"{m}.gate.weight", "BF16", [e + ns, d]), (f"{m}.gate.global_scale", "BF16", [1]),
            (f"{m}.gate.{'bias' if raw else 'e_score_correction_bias'}", "F32", [e])]
    if raw:
        out += [(f"{m}.experts.w13_weight", "BF16", [e, 2 * mi, d]), (f"{m}.experts.w2_weight", "BF16", [e, d, mi]),
                (f"{m}.shared_experts.shared_w13_weight", "BF16", [ns, 2 * mi, d]),
                (f"{m}.shared_experts.shared_w2_weight", "BF16", [ns, d, mi])]
    else:
        out += [(f"{m}.experts.gate_up_proj", "BF16", [e, 2 * mi, d]), (f"{m}.experts.down_proj", "BF16", [e, d, mi]),
                (f"{m}.shared_experts.gate_proj", "BF16", [ns, mi, d]), (f"{m}.shared_experts.up_proj", "BF16", [ns, mi, d]),
                (f"{m}.shared_experts.down_proj", "BF16", [ns, d, mi])]


def inkling_inventory(config, raw=True):
    c = config["text_config"]
    d, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    a = config["audio_config"]
    lm = "model.llm" if raw else "model.language_model"
    out = [(f"{lm}.embed.weight" if raw else f"{lm}.embed_tokens.weight", "BF16", [v, d]),
           (f"{lm}.embed_norm.weight" if raw else f"{lm}.embed_tokens.embed_norm.weight", "BF16", [d]),
           (f"{lm}.norm.weight", "BF16", [d]),
           ("model.llm.unembed.weight" if raw else "lm_head.weight", "BF16", [v, d]),
           ("model.audio.encoder.weight" if raw else "model.audio_tower.embed_audio_tokens.embed_audio_tokens.weight",
            "BF16", [a["n_mel_bins"] * a["mel_vocab_size"], d]),
           ("model.audio.final_norm.weight" if raw else "model.audio_tower.norm.weight", "BF16", [d])]
    for i in range(n):
        inkling_block(out, f"{lm}.layers.{i}", (i + 1) % 6 != 0, i >= c["dense_mlp_idx"], c, raw)
    mtp = config["mtp_config"]
    for k in range(mtp["num_nextn_predict_layers"]):
        p = f"model.mtp.layers.{k}"
        out += [(f"{p}.embed_norm.weight", "BF16", [d]), (f"{p}.hidden_norm.weight", "BF16", [d]),
                (f"{p}.input_proj.weight", "BF16", [d, 2 * d])]
        inkling_block(out, f"{p}.transformer_block", k in mtp["local_layer_ids"], False, c, True)
    return out


def inkling_hf_inventory(config):
    return inkling_inventory(config, raw=False)


# The projections an NVFP4 release quantizes (raw and hf names), inside model.llm / language_model layers.
NVFP4_MATRICES = ("_proj.weight", "experts.gate_up_proj", "experts.down_proj", "shared_experts.gate_proj",
                  "shared_experts.up_proj", "shared_experts.down_proj", "attn.wq_du.weight", "attn.wk_dv.weight",
                  "attn.wv_dv.weight", "attn.wr_du.weight", "attn.wo_ud.weight", "mlp.w13_dn.weight",
                  "mlp.w2_md.weight", "experts.w13_weight", "experts.w2_weight", "shared_w13_weight",
                  "shared_w2_weight")
ONE_F32 = struct.pack("<f", 1.0)


def nvfp4_inventory(tensors, divides):
    """The BF16 projections of the decoder layers as NVFP4 tensors (compressed-tensors names when
    divides, else ModelOpt's); global scales hold 1.0."""
    out = []
    for name, dt, shape in tensors:
        if dt != "BF16" or ".layers." not in name or name.startswith("model.mtp.") or not name.endswith(NVFP4_MATRICES):
            out.append((name, dt, shape))
            continue
        lead, cols = shape[:-1], shape[-1]
        n = shape[0] if len(shape) == 3 else 1
        out += [(name + ("_packed" if divides else ""), "U8", lead + [cols // 2]),
                (name + "_scale", "F8_E4M3", lead + [cols // 16]),
                (name + ("_global_scale" if divides else "_scale_2"), "F32", [n] if len(shape) == 3 else [],
                 ONE_F32 * n)]
    return out


def inkling_nvfp4_inventory(config):
    return nvfp4_inventory(inkling_inventory(config), divides=False)


def inkling_hf_nvfp4_inventory(config):
    return nvfp4_inventory(inkling_hf_inventory(config), divides=True)



# ---- Kimi K3 (glm_kimi_inkling.md Corrections, §3, §5) ----------------------------------------
#
# config.json: the published moonshotai/Kimi-K3 config (root model_type kimi_k3, text_config
# kimi_linear), fields the text model reads. Tensor names, shapes and dtypes: the release's
# safetensors headers as third-party loaders record them (layer 12's non-expert manifest and the
# per-expert MXFP4 packing; MLA, dense-layer and root tensors from the HF key map). Uncertain points:
#  - the published index totals (tensor count, total_size) were not available: the inventory is not
#    checked against them, and the vision tower / mm_projector tensors of the release are left out
#    (cairn runs the text model only);
#  - MLA-layer and root dtypes are taken as BF16 like every other matrix of the release.

K3_CONFIG = {
    "architectures": ["KimiK3ForConditionalGeneration"],
    "model_type": "kimi_k3",
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "pad_token_id": 163839,
    "media_placeholder_token_id": 163605,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "dtype": "bfloat16",
        "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "attn_res_block_size": 12,
        "bos_token_id": 163584, "eos_token_id": 163586, "first_k_dense_replace": 1, "hidden_act": "situ",
        "hidden_size": 7168, "intermediate_size": 33792, "kv_lora_rank": 512, "latent_moe_use_norm": True,
        "linear_attn_config": {
            "full_attn_layers": [i for i in range(1, 94) if i % 4 == 0 or i == 93],
            "gate_lower_bound": -5.0, "head_dim": 128,
            "kda_layers": [i for i in range(1, 94) if i % 4 != 0 and i != 93],
            "num_heads": 96, "short_conv_kernel_size": 4, "use_full_rank_gate": True},
        "max_position_embeddings": 1048576, "mla_use_nope": True, "mla_use_output_gate": True,
        "moe_intermediate_size": 3072, "moe_layer_freq": 1, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "num_attention_heads": 96, "num_expert_group": 1,
        "num_experts": 896, "num_experts_per_token": 16, "num_hidden_layers": 93, "num_key_value_heads": 96,
        "num_nextn_predict_layers": 0, "num_shared_experts": 2, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "routed_expert_hidden_size": 3584,
        "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc",
        "use_grouped_topk": True, "v_head_dim": 128, "vocab_size": 163840,
        "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                                "ignore": ["re:.*shared_experts.*"],
                                "config_groups": {"group_0": {"format": "mxfp4-pack-quantized",
                                                              "targets": ["Linear"],
                                                              "weights": {"num_bits": 4, "group_size": 32}}}},
    },
}


def k3_glu(out, p, inter, d):
    out += [(f"{p}.gate_proj.weight", "BF16", [inter, d]), (f"{p}.up_proj.weight", "BF16", [inter, d]),
            (f"{p}.down_proj.weight", "BF16", [d, inter])]


def k3_kda(out, a, c):
    la, d = c["linear_attn_config"], c["hidden_size"]
    hd, proj = la["head_dim"], la["num_heads"] * la["head_dim"]
    out += [(f"{a}.A_log", "F32", [128]), (f"{a}.b_proj.weight", "BF16", [la["num_heads"], d]),
            (f"{a}.dt_bias", "F32", [proj]), (f"{a}.f_a_proj.weight", "BF16", [hd, d]),
            (f"{a}.f_b_proj.weight", "BF16", [proj, hd]), (f"{a}.g_proj.weight", "BF16", [proj, d]),
            (f"{a}.o_norm.weight", "F32", [hd]), (f"{a}.o_proj.weight", "BF16", [d, proj])]
    for n in ("q", "k", "v"):
        out += [(f"{a}.{n}_proj.weight", "BF16", [proj, d]),
                (f"{a}.{n}_conv1d.weight", "F32", [proj, 1, la["short_conv_kernel_size"]])]


def k3_mla(out, a, c):
    d, h, ql, kvl = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    out += [(f"{a}.q_a_proj.weight", "BF16", [ql, d]), (f"{a}.q_a_layernorm.weight", "BF16", [ql]),
            (f"{a}.q_b_proj.weight", "BF16", [h * (nope + rope), ql]),
            (f"{a}.kv_a_proj_with_mqa.weight", "BF16", [kvl + rope, d]),
            (f"{a}.kv_a_layernorm.weight", "BF16", [kvl]),
            (f"{a}.kv_b_proj.weight", "BF16", [h * (nope + vd), kvl]),
            (f"{a}.g_proj.weight", "BF16", [h * vd, d]), (f"{a}.o_proj.weight", "BF16", [d, h * vd])]


def k3_moe(out, p, c):
    d, e, lat, inter = c["hidden_size"], c["num_experts"], c["routed_expert_hidden_size"], c["moe_intermediate_size"]
    out += [(f"{p}.gate.e_score_correction_bias", "F32", [e]), (f"{p}.gate.weight", "BF16", [e, d]),
            (f"{p}.routed_expert_down_proj.weight", "BF16", [lat, d]),
            (f"{p}.routed_expert_norm.weight", "BF16", [lat]), (f"{p}.routed_expert_up_proj.weight", "BF16", [d, lat])]
    k3_glu(out, f"{p}.shared_experts", inter * c["num_shared_experts"], d)
    for i in range(e):
        for name, rows, cols in (("w1", inter, lat), ("w2", lat, inter), ("w3", inter, lat)):
            out += [(f"{p}.experts.{i}.{name}.weight_packed", "U8", [rows, cols // 2]),
                    (f"{p}.experts.{i}.{name}.weight_scale", "U8", [rows, cols // 32])]


def k3_inventory(root):
    c = root["text_config"]
    d, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    m = "language_model.model"
    out = [(f"{m}.embed_tokens.weight", "BF16", [v, d]), (f"{m}.norm.weight", "BF16", [d]),
           (f"{m}.output_attn_res_norm.weight", "BF16", [d]), (f"{m}.output_attn_res_proj.weight", "BF16", [1, d]),
           ("language_model.lm_head.weight", "BF16", [v, d])]
    kda = set(c["linear_attn_config"]["kda_layers"])
    for i in range(n):
        p = f"{m}.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", "BF16", [d]), (f"{p}.post_attention_layernorm.weight", "BF16", [d])]
        for site in ("self_attention_res", "mlp_res"):
            out += [(f"{p}.{site}_norm.weight", "BF16", [d]), (f"{p}.{site}_proj.weight", "BF16", [1, d])]
        (k3_kda if i + 1 in kda else k3_mla)(out, f"{p}.self_attn", c)
        if i < c["first_k_dense_replace"]:
            k3_glu(out, f"{p}.mlp", c["intermediate_size"], d)
        else:
            k3_moe(out, f"{p}.block_sparse_moe", c)
    return out


FAMILIES = {
    "deepseek_v4": (DSV4_CONFIG, dsv4_inventory, DSV4_TENSORS, DSV4_TOTAL_SIZE),
    "glm": (GLM_CONFIG, glm_inventory, GLM_TENSORS, GLM_TOTAL_SIZE),
    "kimi_k3": (K3_CONFIG, k3_inventory, None, None),
    "inkling": (INKLING_CONFIG, inkling_nvfp4_inventory, None, None),
    "inkling-hf": (INKLING_CONFIG, inkling_hf_nvfp4_inventory, None, None),
}

# ---- writing ---------------------------------------------------------------------------------


def nbytes(dtype, shape):
    n = DTYPE_SIZE[dtype]
    for s in shape:
        n *= s
    return n


def check_inventory(family, tensors, want_count, want_total):
    names = [t[0] for t in tensors]
    if len(set(names)) != len(names):
        sys.exit(f"{family}: duplicate tensor names in the inventory")
    total = sum(nbytes(t[1], t[2]) for t in tensors)
    if want_count is not None and (len(tensors) != want_count or total != want_total):
        sys.exit(f"{family}: inventory has {len(tensors)} tensors / {total} bytes, "
                 f"published {want_count} / {want_total}")
    return total


def split_shards(tensors, shard_bytes):
    shards, cur, size = [], [], 0
    for t in tensors:
        n = nbytes(t[1], t[2])
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    if cur:
        shards.append(cur)
    return shards


def write_sparse_shard(path, tensors):
    """Header, then extend the file to its full size: the data section is one hole.
    Entries are laid out widest dtype first (as the safetensors library does), so every tensor
    starts aligned to its element size."""
    order = sorted(tensors, key=lambda t: (-DTYPE_SIZE[t[1]], t[0]))
    header, off = {"__metadata__": {"format": "pt"}}, 0
    filled = []
    for t in order:
        name, dt, shape = t[:3]
        n = nbytes(dt, shape)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        if len(t) > 3:
            filled.append((off, t[3]))
        off += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.truncate(8 + len(blob) + off)
        for at, data in filled:
            f.seek(8 + len(blob) + at)
            f.write(data)


def write_checkpoint(family, outdir, shard_bytes):
    config, inventory, want_count, want_total = FAMILIES[family]
    tensors = inventory(config)
    total = check_inventory(family, tensors, want_count, want_total)
    os.makedirs(outdir, exist_ok=True)
    for stale in glob.glob(os.path.join(outdir, "*.safetensors")):
        os.remove(stale)
    shards = split_shards(tensors, shard_bytes)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_sparse_shard(os.path.join(outdir, fname), shard)
        weight_map.update((t[0], fname) for t in shard)
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    # config.json last: its presence marks a complete checkpoint for callers that cache it.
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return len(tensors), total, len(shards)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("out")
    ap.add_argument("--shard-gb", type=float, default=5.0, help="approximate shard size (GB)")
    a = ap.parse_args()
    if a.shard_gb <= 0:
        ap.error("--shard-gb must be positive")
    config_path = os.path.join(a.out, "config.json")
    if os.path.exists(config_path):
        os.remove(config_path)
    n, total, shards = write_checkpoint(a.family, a.out, int(a.shard_gb * 1e9))
    print(f"{a.family}: {n} tensors, {total} bytes (sparse) in {shards} shards -> {a.out}")


if __name__ == "__main__":
    main()
