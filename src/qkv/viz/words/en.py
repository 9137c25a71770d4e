"""Every sentence qkv's pages and lessons show, in English: one table per page, each entry a `str.format`
template the page fills in with the numbers it computed ({name}, {name:.3f}; pipeline.js reads the same syntax).

`ko.py` holds the same tables in Korean, with exactly the same keys and fields (tests/test_words.py checks it);
a page only in English (VIEWER) has no Korean table. `viz.words.texts(page)` gives a page's tables by language.
A new sentence goes here and in ko.py, nowhere else.
"""

from __future__ import annotations

# `qkv explain` (lessons.attention, lessons.attention_render): the walkthrough of one head; the pipeline
# page says some of them too (`viz.pipeline_text.SHARED_KEYS`)
EXPLAIN = {
    "title": "qkv explain · {model} · layer {layer} · head {head} of {H}",
    "formula": "Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k) · V, for one head of the real model, step by step. "
               "d_model = {d_model}, H = {H} heads, d_k = d_model / H = {d_k}.",
    "library": "Like a library: the query is what you are looking for, each key is a book's index label, "
               "each value is the book itself; a query that matches a key takes more of that value.",

    "s_tokens": "⓪ Tokens → ids",
    "tokens": "The tokenizer cuts the text into n = {n} tokens; each id picks a row of the embedding table.",
    "col_token": "token", "col_spelled": "spelled", "col_id": "id",
    "tokens_bpe": "Tokens are shown as text, whitespace visible (␣ a space, ↵ a new line); byte-level BPE "
                  "spells them with one character per byte (a space as Ġ, a new line as Ċ).",

    "s_x": "① X: the input of layer {layer}",
    "x": "X is the residual stream entering layer {layer}: one row of d_model numbers per token. Shape {shape}.",
    "x_embed": "In layer 0, X is the embedding: token + position{types} vectors{embed_norm}.",
    "x_types": " + segment", "x_embed_norm": ", then LayerNorm",
    "x_embed_rope": "In layer 0, X is the token embedding alone: no position vector is added. This model brings "
                    "positions in later, by turning Q and K (RoPE, step ②a).",
    "x_post": "{model} is post-norm (BERT): attention reads X itself, and LayerNorm comes after the residual "
              "add: X' = Norm(X + Attention(X)).",
    "x_pre": "{model} is pre-norm: attention reads Norm(X), and X flows on unchanged through the residual: "
             "X' = X + Attention(Norm(X)).",
    "first_values": "first {k} values",

    "s_norm": "①a {name}: what attention reads",
    "norm_rms": "Attention reads Norm(X), not X. RMSNorm(x) = x / √(mean(x²) + ε) · g, with ε = {eps:g} and a "
                "learned gain g {gs}: every row is scaled to a root-mean-square of 1 (unlike LayerNorm, the mean "
                "is not subtracted and there is no bias). For “{token}”: √(mean(x²) + ε) = {scale:.4f}.",
    "norm_layer": "Attention reads Norm(X), not X. LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · g + b, with "
                  "ε = {eps:g} and learned g, b {gs}. For “{token}”: mean(x) = {mean:.4f}, "
                  "√(var(x) + ε) = {scale:.4f}.",
    "norm_check": "Equal to the engine's {name} (largest difference {diff:.1e}).",

    "s_qkv": "② Q, K, V: three projections of the same X",
    "w_q": "W_Q is {W} (d_model × H·d_k); head {head} uses its columns {lo}..{hi}: W_Q^{head} is {Wh}.",
    "qkv": "Q = {x_name}·W_Q^{head}{b}   {xs} · {ws} = {qs}.   K and V the same way with W_K, W_V: "
           "K {ks}, V {vs}.",
    "qkv_check": "Equal to the q, k, v the model computed (largest difference {diff:.1e}).",
    "qkv_check_rope": "Q and K are shown before RoPE (step ②a turns them); V equals the v the model computed "
                      "(largest difference {diff:.1e}).",

    "s_rope": "②a RoPE: Q and K turned by their position",
    "rope_what": "Attention by itself is blind to order. RoPE (guide: positions) turns each query and key by an angle "
                 "that grows with its position p: the d_k = {d_k} numbers form {pairs} pairs (i, i + {pairs}), and "
                 "pair i turns by p·ω_i, ω_i = θ^(−2i/d_k), θ = {theta:g}. Pair 0 turns {w0:.3f} rad per token, "
                 "pair {last} only {wl:.1e}: fast pairs tell near positions apart, slow ones far ones.",
    "rope_pair": "The query of “{token}” at position {p}, before and after: pair 0 turns by {a0:.3f} rad, the last "
                 "pair by {al:.1e} rad; a rotation keeps the length |q|.",
    "col_pair": "pair ({a}, {b})", "before": "before RoPE", "after": "after RoPE",
    "rope_check": "RoPE recomputed from θ gives the q and k the model used (largest difference {diff:.1e}).",
    "rope_relative": "Why turn them: after RoPE, q·k depends only on how far apart the two tokens are (m − n), not "
                     "on where they stand. The query of “{q}” and the key of “{k}”, moved together to other "
                     "positions:",
    "col_qpos": "q at m", "col_kpos": "k at n",
    "rope_relative_end": "The same distance gives the same score (largest difference {spread:.1e}); the first row is "
                         "S[{q}, {k}] of step ③. Another distance gives another score.",

    "s_gqa": "②b GQA: {H} query heads share {H_kv} K/V heads",
    "gqa_what": "W_Q is {wq} but W_K and W_V are {wk}: per token the model computes {H} queries but only {H_kv} "
                "keys and {H_kv} values. Q {qs}, K {ks}, V {ks}. Each K/V head serves a group of G = {G} query "
                "heads: query head h reads K/V head ⌊h / G⌋.",
    "col_kv_head": "K/V head", "col_query_heads": "query heads that read it",
    "gqa_follow": "Head {head} reads K/V head {kv}, as heads {others} do. The KV cache keeps {H_kv} heads of K and V "
                  "per token instead of {H}: {G}× less memory.",
    "gqa_check": "The scores of heads {heads}, recomputed with their one shared K, equal the model's (largest "
                 "difference {diff:.1e}).",
    "row_of": "row of “{token}”",

    "s_s": "③ Q·Kᵀ: every query against every key",
    "s": "{qs} · {kts} = {ss}. (Q·Kᵀ)[i, j] is the dot product of token i's query with token j's key: "
         "how well they point the same way. {corner}:",

    "s_scale": "④ Scaling: the scores S = Q·Kᵀ / √d_k",
    "scale": "√d_k = √{d_k} = {sqrt:.3f}. Dividing keeps the scores in a range where softmax still spreads "
             "its weight (why: step ⑧). Shape {ss}. {corner}:",
    "corner": "Top-left corner", "whole": "All of it",
    "mask": "Causal mask (guide: mask): M[i, j] = −∞ above the diagonal, where key j comes after query i, so "
            "softmax gives it 0: no token sees the future. {masked} of the {total} scores are masked, shown as −∞.",
    "alibi": "ALiBi (BLOOM, Falcon): no position embedding; S gets + m·p_j, this head's slope m = {slope:.4g} "
             "(Falcon's divided by √d_k, as its scores) times key j's position, so a query's far-back keys score "
             "lower, each head by its own slope.",
    "scale_check": "Equal to the scores the model computed (largest difference {diff:.1e}).",

    "s_softmax": "⑤ Softmax: A = softmax(S + M), row by row",
    "softmax": "Each row turns into weights between 0 and 1 that sum to 1 (largest deviation of a row sum: "
               "{dev:.1e}). Shape {ss}. The row of “{token}”:",
    "looks_most": "“{token}” looks most at “{target}” (token {j}), with weight {w:.3f}.",
    "col_key": "key",

    "s_z": "⑥ Z = A·V: the weighted sum of the values",
    "z": "{as_} · {vs} = {zs}. Each token's output is a mix of every token's value, in proportion to "
         "its weights. For “{token}”:",
    "z_seed": "(as in the guide's 3-token example: Z1 = 0.7·v1 + 0.2·v2 + 0.1·v3)",
    "z_check": "Equal to the head output the model computed (largest difference {diff:.1e}).",

    "s_out": "⑦ Concat(Z_0 … Z_{last}) · W_O: the heads together",
    "out": "The {H} heads' outputs side by side make {cs}; W_O {ws} mixes them back to d_model: "
           "{cs} · {ws}{b} = {os}.",
    "out_check": "Equal to the attention output the model computed (largest difference {diff:.1e}).",
    "out_post": "The block then adds it to X and normalises: Norm(X + Attention(X)); the FFN follows.",
    "out_pre": "The block then adds it to X (the residual); the FFN follows.",

    "s_why": "⑧ Why divide by √d_k",
    "why_var": "The dot product of two random vectors with d_k independent unit-variance entries has variance "
               "d_k (its typical size grows like √d_k). Measured on {N} random pairs (seed 0):",
    "col_dk": "d_k", "col_var": "var(q·k)", "col_std": "std(q·k)", "col_var_scaled": "var(q·k / √d_k)",
    "why_var_end": "At d_k = 64 the scores are about 8 times larger (√64 = 8); divided by √d_k the variance is "
                   "about 1 at every size.",
    "why_softmax": "Large scores make softmax saturate: nearly all weight on one key, and its gradient "
                   "p·(1 − p) vanishes, so training stops learning from the others.",
    "why_softmax_end": "softmax([100, 1, 1]) leaves the other keys about 10⁻⁴³ of the weight; scaled down 10 "
                       "times they get about 10⁻⁴ and the gradient is alive again; 100 times, a real share.",
    "col_scores": "scores", "col_softmax": "softmax", "col_grad": "largest p·(1 − p)",
    "why_model": "On the real model, the same rows without the 1/√d_k scaling "
                 "(entropy in nats: 0 = all weight on one key, log n = {logn:.2f} = spread evenly):",
    "col_what": "", "col_scaled": "with /√d_k", "col_unscaled": "without",
    "this_head": "head {head}: mean entropy of a row", "this_head_max": "head {head}: mean largest weight",
    "all_heads": "all {H} heads of layer {layer}: mean entropy", "all_heads_max":
        "all {H} heads of layer {layer}: mean largest weight",
    "why_end": "Without the scaling the rows are sharper: the model would attend to fewer tokens at once.",
}

# the pipeline page's own words (pipeline.js, pipeline_diagram.js; `viz.pipeline_text` adds EXPLAIN's where
# they fit): the boxes of the whole model, from tokens to the next token
PIPELINE = {
    "p_title": "qkv pipeline · {model}",
    "p_intro": "The model drawn as its data flow, with this text's real numbers in every box. Click a box to "
               "open it; choose a token, a layer and a head above.",
    "p_token": "token", "p_layer": "layer", "p_head": "head", "p_lang": "한국어",
    "p_qknorm": "q/k norm", "p_qknorm_head_f": "q = Norm(q),  k = Norm(k)   over each head's d_k numbers, before RoPE",
    "p_qknorm_all_f": "q = Norm(q),  k = Norm(k)   over the whole projection (H·d_k numbers), before the heads are split",
    "p_qknorm_what": "The scores cannot grow just because q and k grow long. The q and k shown are after it (and RoPE).",
    "p_rope_none": "Layer {layer} has no RoPE: its Q and K carry no position (a layer without RoPE).",
    "p_rope_local": "Layer {layer} is a sliding layer: its RoPE base is {theta} (the other layers' {base}).",
    "p_alibi": "ALiBi: a bias by distance",
    "p_alibi_f": "S[i, j] = S[i, j] + m_h·j   (m_h = {slope} for head {head})",
    "p_alibi_what": "No position vectors anywhere: each head adds its own slope times the key's position. Row by "
                    "row softmax ignores a constant, so this is −m_h·(i − j): the farther back a key, the lower its score.",
    "p_softcap": "Soft-cap", "p_softcap_f": "S = c·tanh(S / c),   c = {c}",
    "p_softcap_what": "Scores stay within ±c: large ones are squashed, small ones pass almost unchanged.",
    "p_s_scaled_f": "S = Q·Kᵀ · {scale}   (this model's own scale instead of 1/√d_k)",
    "p_mask_chunk_f": "S' = S + M,  M[i, j] = −∞ unless j ≤ i and ⌊j / {c}⌋ = ⌊i / {c}⌋   (layer {layer} sees its own chunk of {c} positions)",
    "p_mask_window_f": "S' = S + M,  M[i, j] = −∞ unless i − {w} < j ≤ i   (layer {layer} sees the last {w} keys)",
    "p_out_norm": "Then normalised before it joins the stream: out = Norm(Concat(Z)·W_O).",
    "p_res_parallel_f": "X'' = X + Attention(Norm(X)) + FFN(Norm(X))   (parallel: the FFN reads X, not X')",
    "p_router": "Router: which experts", "p_router_f": "p = softmax(x·W_router) over {E} experts; the top {k} run: "
                                                     "FFN(x) = Σ_e w_e·FFN_e(x)",
    "p_router_shared": "+ σ(x·w_gate)·FFN_shared(x): a shared expert every token runs.",
    "p_router_f_sigmoid": "s = σ(x·W_router) for each of {E} experts; the top {k} run: FFN(x) = Σ_e w_e·FFN_e(x)",
    "p_router_shared_plain": "+ FFN_shared(x): a shared expert every token runs, ungated.",
    "p_router_bias": "The choice ranks s + b: b, one number per expert, picks experts but never weighs them.",
    "p_router_groups": "Only experts of the best {kept} of {G} groups may be chosen (a group ranks by its two best).",
    "p_router_scale": "The weights w are multiplied by {c}.",
    "p_router_dense": "Layer {layer} is dense: one FFN for every token, no router.",
    "p_router_token": "“{token}” went to:", "p_expert": "expert", "p_weight": "weight",
    "p_final_softcap": "logits = c·tanh(logits / c),   c = {c}",
    "p_logit_scale": "logits × {s}   (the model's logit scale)",
    "p_embed_mult": "X = E[ids] × {m}",
    "p_embed": "Embedding (+ positions)", "p_rope": "RoPE: Q and K turned by their position",
    "p_embed_f": "X = E[ids] + P[positions]   (n × d_model)",
    "p_block": "Block {layer} of {L}",
    "p_blocks": "{L} blocks, each: {what}",
    "p_norm": "Norm", "p_norm2": "Norm (before the FFN)",
    "p_norm_rms_f": "RMSNorm(x) = x / √(mean(x²) + ε) · g",
    "p_norm_layer_f": "LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · g + b",
    "p_qkv_f": "Q = X·W_Q,  K = X·W_K,  V = X·W_V",
    "p_s_f": "S = Q·Kᵀ / √d_k",
    "p_mask": "Mask M", "p_mask_f": "S' = S + M,  M[i, j] = −∞ (j > i), 0 (j ≤ i)",
    "p_mask_none": "No mask: {model} is an encoder, every token sees every token (M = 0).",
    "p_a_f": "A = softmax(S + M), each row sums to 1",
    "p_z_f": "Z = A·V",
    "p_out_f": "Concat(Z_0 … Z_{last})·W_O",
    "p_res": "+ Residual", "p_res2": "+ Residual (after the FFN)",
    "p_res_pre_f": "X' = X + Attention(Norm(X))", "p_res_post_f": "X' = Norm(X + Attention(X))",
    "p_res2_pre_f": "X'' = X' + FFN(Norm(X'))", "p_res2_post_f": "X'' = Norm(X' + FFN(X'))",
    "p_ffn": "FFN", "p_ffn_f": "FFN(x) = act(x·W_in + b)·W_out + b   (d_ff = {d_ff})",
    "p_ffn_gated_f": "FFN(x) = (act(x·W_gate) ⊙ x·W_in)·W_out   (d_ff = {d_ff})",
    "p_final": "Final norm", "p_final_f": "H = Norm(X after block {last})",
    "p_logits": "Logits", "p_logits_f": "logits = H · W_vocab   (n × d_model)·(d_model × V) = n × V",
    "p_logits_what": "One score per vocabulary entry (V = {V}); the page keeps the last position's, the one "
                     "that predicts the next token.",
    "p_probs": "softmax(logits / T) → next token",
    "p_probs_f": "P(next) = softmax(logits[last] / T), then top-k, then top-p",
    "p_temp": "temperature T", "p_topk": "top-k", "p_topp": "top-p", "p_off": "off",
    "p_greedy": "T = 0: greedy, all the mass on the top token.",
    "p_remain": "{k} of {V} tokens remain.",
    "p_next": "next token", "p_prob": "probability", "p_removed": "removed by the filters",
    "p_bar_scale": "A bar's length is the probability itself (full width = 100%).",
    "p_hidden": "Final hidden states", "p_pooled": "Pooled embedding",
    "p_encoder_end": "{model} is an encoder: it has no W_vocab, no logits and no next token. Its output is the "
                     "final hidden states, one vector per token; a sentence embedding is their mean (mean "
                     "pooling), divided by its length.",
    "p_pooled_f": "e = mean_i(H_i) / |mean_i(H_i)|",
    "p_stream": "Residual stream", "p_stream_what": "|x| of each token's residual stream entering each block "
                "(rows: blocks 0…{L}, the last row after the last block); darker = longer (log scale).",
    "p_embed_rope": "X is the token embedding alone: no position vector is added. This model brings positions "
                    "in later, by turning Q and K (the RoPE box).",
    "p_rope_f": "q' = R(p)·q,  k' = R(p)·k:  each pair (x_2i, x_2i+1) turned by the angle p·θ_i,  θ_i = base^(−2i/d)",
    "p_rope_what": "Turning does not change a vector's length: |q'| = |q|. What changes is the angle between a query "
                   "and a key, so their score depends on how far apart they are. The numbers shown are after "
                   "the turn, as attention reads them.",
    "p_rope_latent": "Multi-head latent attention (DeepSeek): only the last {r} of each head's {d_k} numbers are "
                     "turned, and k's {r} are one key every head shares; each head's K and V (V {d_v} wide) come "
                     "from a latent of {r_kv} numbers per token, which is all the KV cache keeps "
                     "(`qkv explain kv-cache`).",
    "p_rope_partial": "Only the first {r} of each head's {d_k} numbers are turned; the rest pass unchanged.",
    "p_rope_pairs": "Pairs are neighbours (x_0, x_1), (x_2, x_3), … (GPT-J's interleaved layout).",
    "p_gqa_what": "Each K/V head is computed once and read by G = {G} query heads: the KV cache holds {H_kv} "
                  "heads, not {H}.",
    "p_gqa": "Query head {head} reads K/V head {kv}: G = {G} query heads share each K/V head ({H} query, "
             "{H_kv} K/V heads).",
    "p_shape": "shape", "p_first": "first {k} values", "p_length": "length |x|",
    "p_row": "row of “{token}”", "p_masked": "masked (−∞)",
    "p_a_quant": "Weights travel as one byte each (±0.002).",
    "p_s_quant": "Scores travel as one byte each (±{step} here).",
    "p_stack": "stack",
    "p_memory_box": "Encoder output M",
    "p_memory": "The encoder's output M: one vector per source token. Every decoder layer reads it through "
                "cross-attention (K = M·W_K, V = M·W_V); switch to the decoder to follow it.",
    "p_mask_enc": "No mask: the encoder reads the source both ways, every token sees every token (M = 0).",
    "p_xnorm": "Norm (before cross-attention)",
    "p_xqkv": "Cross-attention: Q from the decoder, K and V from the encoder",
    "p_xqkv_f": "Q = Y·W_Q (decoder),  K = M·W_K,  V = M·W_V (encoder output M)",
    "p_xattn": "Cross-attention: A = softmax(Q·Kᵀ / √d_k)",
    "p_xattn_what": "Row i: which source tokens target token i reads (n_tgt × n_src = {n} × {m}).",
    "p_xz": "Z = A·V (cross-attention)", "p_xout": "Concat(Z)·W_O (cross-attention)",
    "p_xres": "+ Residual (after cross-attention)",
    "p_xres_pre_f": "X'' = X' + CrossAttention(Norm(X'), M)", "p_xres_post_f": "X'' = Norm(X' + CrossAttention(X', M))",
    "p_reads": "k, v of “{token}”, the source token it reads most",
    "p_encoder": "encoder", "p_decoder": "decoder",
    # the attention diagram (pipeline_diagram.js): any cell of S, A, Z worked out from the engine's q, k, v
    "p_ar_title": "The arithmetic, cell by cell",
    "p_ar_hint": "Head {head} (reading K/V head {kv}). Hover a cell of S, A or Z, or focus one and move with the "
                 "arrow keys: its arithmetic appears below, from the engine's own q, k and v.",
    "p_ar_aria": "{matrix}: hover a cell or use the arrow keys to see how it is computed",
    "p_ar_missing": "This page holds the whole q, k and v of layers {layers} only (the arithmetic needs every "
                    "number); choose one of them, or write the page for layer {layer}: "
                    "qkv show TEXT --layer {layer} --out DIR.",
    "p_ar_S": "S[{i}, {j}]: query {i} {q} against key {j} {k}: the {d} products q_i[d]·k_j[d], summed, × {scale}",
    "p_ar_cap": "soft-cap {c}·tanh(S/{c})",
    "p_ar_alibi": "+ ALiBi's bias m_h·(key position)",
    "p_ar_bias": "+ the learned position bias",
    "p_ar_masked": "Key {j} is masked for query {i} (M = −∞): its weight will be 0.",
    "p_ar_A": "A[{i}, {j}]: the softmax of row {i} {q} at key {j} {k}: exp(S − max) of every key, their sum, "
              "and one divided by the sum",
    "p_ar_max": "max of the row = {max}",
    "p_ar_Z": "Z[{i}, {c}]: component {c} of query {i} {q}: every value v_j[{c}] times its weight A[{i}, j], summed "
              "over the {m} keys",
    "p_ar_engine": "engine",
    "p_ar_rest": "the other {k} terms",
    "p_ar_replay": "replay",
    "p_ar_load": "Run layer {layer}'s arithmetic",
    # a layer without softmax (a selective scan, a linear attention): its own steps (viz/pipeline_mixer.py)
    "p_mix_x": "Input projection and conv: x̃", "p_mix_qkv": "q, k, v", "p_mix_bc": "B and C",
    "p_mix_dt_scan": "Δ, the step", "p_mix_dt_delta": "β and the decay g", "p_mix_dt_lightning": "The decay λ",
    "p_mix_matrix": "The implied matrix", "p_mix_out": "Matrix × values",
    "p_mix_mamba": "Layer {layer} is a Mamba layer: a selective scan, no q, k, v and no softmax. Unrolled, each of its "
                   "channels mixes the tokens with one lower-triangular matrix (Ali et al. 2024).",
    "p_mix_mamba2": "Layer {layer} is a Mamba-2 layer: a selective scan whose decay is one number per head, so each "
                    "head mixes the tokens with one lower-triangular matrix (SSD, Dao & Gu 2024).",
    "p_mix_parallel": "Layer {layer} runs attention and a Mamba-2 mixer side by side on the same Norm(X) (Falcon-H1): "
                      "the mixer's steps follow the attention's; their outputs are added.",
    "p_mix_delta": "Layer {layer} is a gated delta layer (Qwen3-Next's linear attention): a d_k × d_v state per "
                   "value head, no softmax. The state is linear in the values, so it is one matrix over the tokens.",
    "p_mix_lightning": "Layer {layer} is lightning attention (MiniMax): a linear attention with a decay per head, no "
                       "softmax, no RoPE, no 1/√d_k.",
    "p_mix_x_mamba_f": "[u | z] = h·W_in,   x̃ = act(conv_{k}(u))   (B, n, E = {E})",
    "p_mix_x_mamba2_f": "[z | u | δ] = h·W_in,   [x̃ | B | C] = act(conv_{k}(u))   x̃: (B, n, H = {H}, P = {P})",
    "p_mix_qkv_delta_f": "[q | k | v] = act(conv_{k}(h·[W_q | W_k | W_v])),   q̂ = q/‖q‖·d_k^−½,   k̂ = k/‖k‖",
    "p_mix_qkv_lightning_f": "[q | k | v] = act(h·W_QKV)   (no RoPE, no 1/√d_k)",
    "p_mix_dt_mamba_f": "Δ = softplus(δ·W_dt + b_dt),   the state decays by exp(Δₜ·A[c, n]),  A = −exp(A_log)",
    "p_mix_dt_mamba2_f": "Δ = softplus(δ + b_dt),   the state decays by exp(Δₜ·A_h),  A_h = −exp(A_log)",
    "p_mix_dt_delta_f": "β = σ(h·W_b),   g = −exp(A_log)·softplus(h·W_a + b_dt),   the state decays by exp(g)",
    "p_mix_dt_lightning_f": "λ_h = exp(−r_h): each step back multiplies a key's share by λ (the same at every token)",
    "p_mix_bc_f": "B: what each token writes into the state;  C: what reads it back  (the scan's k and q, N = {N})",
    "p_mix_matrix_scan_f": "α[t, s] = Cₜ·(Π_(r = s+1..t) exp(Δᵣ·A))·Bₛ·Δₛ    (0 for s > t)",
    "p_mix_matrix_delta_f": "A[t, s] = βₛ·q̂ₜᵀ·(Π_(r = s+1..t) exp(g_r)·(I − β_r·k̂_r·k̂_rᵀ))·k̂ₛ    (0 for s > t)",
    "p_mix_matrix_lightning_f": "A[t, s] = (qₜ·kₛ)·λ^(t − s)    (0 for s > t)",
    "p_mix_matrix_what": "No softmax: a number may be negative and a row need not sum to 1. Every attention view, "
                         "rollout and lesson reads |·| with each row divided by its sum. Shown: {what}.",
    "p_mix_out_scan_f": "y = α·x̃  (+ D ⊙ x̃, a skip kept apart),   then the gate SiLU(z), (a norm) and W_out",
    "p_mix_out_linear_f": "o = A·v,   then a norm, a gate and the output projection",
    "p_mix_sum": "Σₛ M[{t}, s]·v_s[{c}] = {sum}   the engine's output: {engine}",
    "p_mix_skip": "D = {d}: y + D·x̃ is added after the matrix",
    "p_mix_whole": "The whole matrix of layer {layer} is not in this page (too large): the sums are shown for the "
                   "layers nearest the one it opened at.",
    "p_mix_outproj": "The output projection: back to d_model",
    "p_mix_what_mamba": "channel {i}", "p_mix_what_mamba2": "Mamba head {i}", "p_mix_what_delta": "value head {i}",
    "p_mix_what_lightning": "head {i}",
    "p_mix_pick": "matrix", "p_mix_decay": "log decay",
    "p_out_beside_f": "Attention(h·{a_in})·{a_out} + Mixer(h)·{ssm}   (h = Norm(X): both boxes read it)",
    "p_res_minimax_f": "X' = {alpha}·Norm(X) + {beta}·Attention(Norm(X))   (the normalised stream goes on)",
    "p_res2_minimax_f": "X'' = {alpha}·Norm(X') + {beta}·FFN(Norm(X'))",
    "p_res_mixer_f": "X' = X + Mixer(Norm(X))   (the mixer in attention's place)",
    "p_z_gated": "This layer gates each head: what W_O reads, and what is shown, is Z_h ⊙ σ(X·W_G)_h.",
}

# qkv explain ffn (lessons.ffn, lessons.ffn_figures)
FFN = {
    "title": "qkv explain ffn · {model} · layer {layer} of {L} · “{token}”",
    "intro": "Every block has two boxes: attention, which moves information between tokens, and the FFN, which "
             "works on each token alone (guide: block): FFN(h) = act(h·W_in + b_in)·W_out + b_out, or gated "
             "(SwiGLU): (act(h·W_gate) ⊙ h·W_in)·W_out. Here one token's vector goes through it step by step, "
             "with the model's real weights.",

    "s_place": "① Where the FFN sits: layer {layer} of {model}",
    "place_pre": "A pre-norm block: attention's output a joins the stream first, then the FFN reads that stream "
                 "normalised, h = Norm₂(x + a), and its output is added to the stream as well:",
    "place_pre_bare": "This block has no norm before the FFN: it reads the stream itself, h = x + a (attention's "
                      "output a already added), and its output is added to the stream:",
    "place_parallel": "A parallel block (GPT-NeoX): attention and the FFN both read the block's input x, each through "
                      "its own norm, h = Norm₂(x); both outputs are added to x together:",
    "place_parallel_shared": "A parallel block with one norm (Phi): attention and the FFN both read h = Norm₁(x), "
                             "the block's input normalised once; both outputs are added to x together:",
    "place_post": "A post-norm block (BERT): each norm comes after its residual. The FFN reads h = Norm₁(x + a), "
                  "the stream after attention and its norm, and the block ends with Norm₂(h + FFN(h)):",
    "f_pre": "  h = Norm₂(x + a)        x ← x + a + FFN(h)",
    "f_pre_bare": "  h = x + a               x ← x + a + FFN(h)",
    "f_parallel": "  h = Norm₂(x)            x ← x + Attn(Norm₁(x)) + FFN(h)",
    "f_parallel_shared": "  h = Norm₁(x)            x ← x + Attn(h) + FFN(h)",
    "f_post": "  h = Norm₁(x + a)        x ← Norm₂(h + FFN(h))",
    "place_out_norm": "This model also normalises the FFN's output before it joins the stream (a norm after the box, "
                      "as Gemma 2 and OLMo 2 do): what is added is Norm_out(FFN(h)).",
    "place_mult": "Each box's output is multiplied by m = {m} before it joins the stream (Granite's residual "
                  "multiplier).",
    "place_numbers": "At “{token}” (position {pos} of {n}): the stream entering the block has ‖x‖ = {nx:.3f}; what the "
                     "FFN reads has ‖h‖ = {nh:.3f}, h = {h}.",
    "dims": "The FFN widens the token's d_model = {d_model} numbers to d_ff = {d_ff} ({ratio:.2f} × d_model) and "
            "brings them back. Its weights in this layer, beside attention's:",
    "col_matrix": "weights", "col_shape": "shape", "col_params": "parameters",
    "row_ffn": "FFN, total", "row_attn": "attention (W_Q, W_K, W_V, W_O)",
    "params_end": "The FFN holds {share:.0%} of this layer's weights, {ratio:.1f}× attention's.",
    "params_most": "Most of what this block stores is in its FFN.",

    "s_in": "② Up to d_ff: u = h·W_in (+ b_in)",
    "s_in_gated": "② Up to d_ff: u = h·W_in (+ b_in) and the gate g = h·W_gate (+ b_gate)",
    "in": "Each column of W_in is a key (Geva et al. 2021): u_i = h·W_in[:, i]{b} is large when this token's h "
          "matches the pattern neuron i detects. h {hs} · W_in {ws} = u {us}:",
    "in_gated": "A gated FFN has a second matrix of the same shape: g = h·W_gate, {d_ff} numbers that decide how much "
                "of each u_i passes:",
    "largest": "largest",

    "s_act": "③ The activation: a = {formula}",
    "act": "The config's activation is {name}: {formula}.",
    "act_gelu": "GELU(u) = u·Φ(u), Φ the normal distribution's CDF (with erf); smooth, near 0 for u < 0, never below "
                "−0.17",
    "act_gelu_tanh": "GELU with the tanh approximation, ½u(1 + tanh(√(2/π)(u + 0.044715u³))); near 0 for u < 0, never "
                     "below −0.17",
    "act_silu": "SiLU(g) = g·σ(g) (also called swish); near 0 for g < 0, never below −0.28",
    "act_relu": "ReLU(u) = max(0, u); exactly 0 for u < 0",
    "act_relu2": "ReLU²(u) = max(0, u)²; exactly 0 for u < 0, growing as u² above",
    "act_xielu": "xIELU(u) = α_p·u² + β·u for u > 0, (e^min(u, ε) − 1 − u)·α_n + β·u below, with α_p, α_n, β "
                 "and ε learned or stored in each layer (Apertus); near β·u − α_n·u for u ≪ 0",
    "act_gated": "Gated ({glu}): a = act(g) ⊙ u. The gate act(g) is near 0 or positive, and u has either sign, so "
                 "a neuron's a_i is positive or negative.",
    "act_counts": "The hidden vector a has d_ff = {d_ff} numbers: {pos} positive, {neg} negative{zero}; the largest "
                  "|a_i| is {amax:.3f} (neuron {imax}). {few} of them ({frac:.1%}) are above 10 % of that.",
    "zeros": ", {zero} exactly 0",

    "s_out": "④ Back to d_model: FFN(h) = a·W_out{b} = Σ_i a_i·W_out[i]{b}",
    "out": "Each row W_out[i] is the value of neuron i: a vector of d_model = {d_model} numbers the neuron writes into "
           "the stream, a_i times. a · W_out {ws} is a sum of {d_ff} such vectors (Geva et al. 2021's key–value "
           "memory: the key says how much, the value what). FFN(h) = {y}, ‖FFN(h)‖ = {ny:.3f}.",
    "rank": "The {top} neurons that write the most, ranked by |a_i|·‖W_out[i]‖ (the length of what each adds), and "
            "how well each alone points along FFN(h):",
    "col_rank": "#", "col_neuron": "neuron i", "col_cos_one": "cos(a_i·W_out[i], FFN(h))",
    "partial": "The top k alone, summed{bias}, against the whole output FFN(h):",
    "with_bias": " with b_out",
    "col_k": "top k", "col_of": "of d_ff", "col_cos": "cos to FFN(h)", "col_rel": "‖FFN(h) − partial‖ / ‖FFN(h)‖",
    "col_share": "share of Σ|a_i|·‖W_out[i]‖",
    "partial_end": "The partial sum first reaches cos 0.9 at k = {k90} of {d_ff} neurons ({frac:.1%}); k = d_ff gives "
                   "FFN(h) back. The figure draws the cosine for every k.",
    "out_norm_note": "(What joins the stream is Norm_out of this sum: the sum itself is linear in a, so its parts "
                     "add up; the norm after it rescales the whole.)",

    "s_vocab": "⑤ What the top neurons write, read through W_vocab",
    "vocab": "Read as the logit lens reads the stream: a vector v written into the stream scores the vocabulary as "
             "(v ⊙ γ)·W_vocab, γ the final norm's scale (LayerNorm: v centred first; the norm's 1/rms and the "
             "biases left out, so the numbers are per unit of v). Neuron i writes a_i·W_out[i], so its sign is "
             "a_i's: the tokens it raises (promoted) and lowers (suppressed) per unit of |a_i|:",
    "col_promoted": "promoted", "col_suppressed": "suppressed",
    "vocab_out": "The FFN's whole output at this token, as it joins the stream, promotes {up} and suppresses {down}.",
    "skip_no_head": "{model} has no LM head (W_vocab): it ends at its hidden states, so there are no tokens for a "
                    "neuron to promote; this step is skipped.",
    "skip_mlm_head": "{model} reads its logits through a masked-LM head (dense, activation, LayerNorm) before W_vocab, "
                     "which is not linear in the stream: a vector written into it has no logits of its own; this "
                     "step is skipped.",

    "s_check": "⑥ The check: every number against the engine",
    "check": "h, u, a and FFN(h) above were computed here in float64 from this layer's weights. What joins the stream "
             "equals the engine's own ffn_out at “{token}” (largest difference {diff:.1e}; the largest |ffn_out| is "
             "{big:.3f}).",
    "check_neurons": "a equals the engine's hidden activations, the trace's “neurons” (largest difference {diff:.1e}).",
    "check_no_neurons": "(This engine records no FFN hidden activations: a is checked through ffn_out alone.)",
    "check_sum": "The {d_ff} vectors a_i·W_out[i] summed one by one give a·W_out back (largest difference {diff:.1e}): "
                 "k = d_ff has cos {cos:.6f}.",
    "stored": "{model} keeps these weights as the GGUF file's blocks ({kinds}), and the engine multiplies the blocks "
              "in place. The lesson dequantised the {k} matrices of this layer to float32 ({size}, {ms:.0f} ms): the "
              "engine's products equal the products with those exact values.",

    "fig_tenth": "±10 % of the largest |a_i|", "fig_top": "the {k} that write the most (|a_i|·‖W_out[i]‖)",
    "fig_neuron": "neuron i", "fig_a": "{model} · layer {layer} · “{token}”: the hidden vector a ({d_ff} neurons)",
    "fig_k": "k (neurons, largest |a_i|·‖W_out[i]‖ first)", "fig_cos": "cos(top-k partial sum, FFN(h))",
    "fig_partial": "How many neurons make the output",
    "fig_one": "neuron {i} (a = {a:+.2f}) writes", "fig_whole": "the whole FFN output",
    "fig_promoted": "{model} · layer {layer} · “{token}”: tokens promoted (green) and suppressed (red)",
}

# qkv explain flash (lessons.flash)
FLASH = {
    "title": "qkv explain flash · {model} · layer {layer} · head {head} · n = {n}",
    "intro": "softmax needs a whole row, its max and its sum, before it knows any weight; at n tokens that row "
             "is the n × n score matrix S (guide: flash). FlashAttention never holds it: it walks the keys in "
             "tiles and keeps, for each query, the largest score so far m, the running sum ℓ of exp(s − m) "
             "and the running output acc. When a tile raises the max, exp(m_old − m_new) < 1 rescales what was "
             "summed against the old max, so no tile is ever visited twice:",
    "s_row": "① One query row, tile by tile: “{token}”",
    "row": "The query of “{token}” (row {row}) against its n = {n} keys in {T} tiles of {block}; s = q·k/√d_k of "
           "this real head, acc has d_k = {d_k} values:",
    "col_tile": "tile", "col_keys": "keys", "col_scores": "scores s", "col_acc": "acc (first {k})",
    "grew": "The max grew at tile(s) {tiles}: there exp(m_old − m_new) < 1 shrank ℓ and acc, which had been summed "
            "against a smaller max. Where the max held, the factor is 1.",
    "held": "The max of this row sits in the first tile, so every later factor is 1: no rescaling was needed "
            "(another head would show one).",
    "prefix": "After every tile, acc / ℓ is already the attention over the keys seen so far: equal to "
              "softmax over those keys · V (largest difference {diff:.1e}, float64).",
    "s_end": "② The end: Z = acc / ℓ",
    "end_check": "Equal to plain softmax(S)·V over the whole row at once (largest difference {plain:.1e}, both "
                 "float64), to the engine's tiled kernel `kernels.tiled_attention` with tiles of {block} "
                 "(float32, {kernel:.1e}) and to the Z the model computed ({model:.1e}). The scores themselves "
                 "equal the model's ({scores:.1e}).",
    "s_block": "③ A block of queries: rows {q0}–{q1}",
    "block": "The kernel takes a block of queries at once: every row keeps its own m and ℓ, and one tile of "
             "scores (block × block) serves them all. What each key tile is for this block: {kinds}.",
    "col_query": "query", "skipped": "skipped",
    "k_full": "computed", "k_partial": "computed, masked in part", "k_hidden": "skipped (every key hidden)",
    "block_check": "The block's outputs equal the engine's tiled kernel (largest difference {kernel:.1e}) and the "
                   "model's ({model:.1e}).",
    "s_memory": "④ What the tiles save",
    "grid": "The whole grid: {T} tiles, {visited} computed, {hidden} skipped because the causal mask hides them "
            "entirely (the same test `qkv explain sparse` applies to any pattern).",
    "memory": "Memory: at n = {n}, H = {H} heads, the whole S is H·n² floats = {dense}; the engine's kernel holds "
              "one tile of {bq} × {bk} scores per head = {tile}, {ratio:.0f}× less, and the result is the same.",
    "skip": "skip",
    "fig_grid": "{model} · layer {layer} · head {head}: tiles of {block}, in the order visited",
    "fig_tile": "tile",
    "fig_running": "the row of “{token}”: running max m and sum ℓ after each tile",
    "fig_step": "tile {tile}: keys {k0}–{k1}",
    "fig_end": "Z (first {k} values): acc/ℓ = softmax·V ({diff:.0e})",
    "fig_steps": "Online softmax of “{token}” · {model} · layer {layer} · head {head}: orange = this tile, "
                 "blue = seen, grey = not yet; dashed = m",
}

# qkv explain gqa (lessons.gqa)
GQA = {
    "title": "qkv explain gqa · {model}",
    "intro": "Multi-head attention gives every head its own W_Q, W_K and W_V (guide: heads). When a model writes, it "
             "keeps every past token's K and V in the KV cache, and that cache grows with the heads. GQA and MQA "
             "(guide: gqa) let several query heads read one K/V head: the queries stay many, "
             "the cache shrinks.",

    "s_share": "① Who reads what: {H} query heads, {H_kv} K/V heads",
    "mha": "{model} is plain multi-head attention (MHA): each of its {H} query heads reads its own K/V head "
           "(h → h). Nothing is shared; ③ shows what sharing would do to it.",
    "mla": "{model} is multi-head latent attention (MLA): each of its {H} query heads reads a K and a V of its own "
           "(h → h), but all of them are expanded from one latent per token (r_kv = {r_kv} numbers: [K_nope | V] = "
           "c·W_KV_b), and the RoPE part of every head's K (the last d_rot = {d_rot} of its d_k = {d_k}) is one key "
           "all heads share, as MQA's: checked below on the model's own K. ③ pools a plain multi-head model instead.",
    "share": "W_Q makes H = {H} queries per token, W_K and W_V only Hkv = {H_kv} keys and values: Q {kq}, "
             "K and V {kk}. Query head h reads K/V head h // (H/Hkv) = h // {G}: groups of {G} neighbours.",
    "col_kv": "K/V head", "col_queries": "query heads that read it",
    "share_check": "Layer {layer}'s scores of all {H} heads, recomputed as Q_h·K_(h // G)ᵀ/√d_k, equal the model's "
                   "(largest difference {diff:.1e}).",

    "s_cache": "② The cache it saves",
    "cache": "Per token the KV cache keeps K and V in every layer: 2·L·Hkv·d_k·4 bytes (L = {L}, d_k = {d_k}, "
             "float32). The same model with one K/V head per query head (MHA), its own (←), one for all (MQA):",
    "cache_latent": "Per token MLA's cache keeps one latent and one RoPE key in every layer, L·(r_kv + d_rot)·4 bytes "
                    "(L = {L}, r_kv = {r_kv}, d_rot = {d_rot}, float32), not K and V: caching the heads it expands to "
                    "would take L·Hkv·(d_k + d_v)·4 (d_k = {d_k}, d_v = {d_v}), with H K/V heads (MHA) or one (MQA). "
                    "Its own (←):",
    "col_attention": "attention", "col_kv_heads": "K/V heads", "col_per_token": "bytes per token",
    "col_ratio": "× MHA",
    "cache_end": "{model} saves {saved:,} bytes per token against MHA: its cache is {ratio:.0f}× smaller "
                 "(`qkv explain kv-cache` measures it while generating).",

    "s_pool": "③ Turning MHA into GQA: {model}'s K/V heads mean-pooled",
    "pool": "The GQA paper (Ainslie et al. 2023) makes a multi-head model grouped by averaging its K and V "
            "projection heads: group g gets the mean of W_K (and W_V, and their biases) over its H/G neighbouring "
            "heads, in every layer, and each query head reads its group's K/V head. Done here to {model} (H = "
            "{H}) for every G dividing H, run on {text!r} ({n} tokens), without any retraining. How far the "
            "output moves:",
    "col_groups": "K/V heads G", "col_queries_per": "query heads per K/V head",
    "col_rel": "rel. error of the last hidden state", "col_cos": "cos of the sentence embedding",
    "pool_check": "G = {H} pools each head with itself: the model is unchanged, exactly (error {rel:g}). Each "
                  "pooled model equals the dense multi-head model whose K/V heads are the pooled ones repeated "
                  "(largest difference {diff:.1e}): sharing is only the cheaper way to compute it.",
    "pool_end": "With fewer K/V heads the output moves further: at G = {G} (MQA) the last hidden state is off by "
                "{rel:.0%} and the sentence embedding's cosine to the original is {cos:.3f}. The heads were not "
                "trained to share, which is why the paper then trains the pooled model a little more (5 % of "
                "the original steps) to win the quality back, and why models like SmolLM2 are trained with "
                "GQA from the start.",

    "fig_q": "query heads", "fig_kv": "K/V heads", "fig_map": "{model}: {H} query heads → {H_kv} K/V heads",
    "fig_rel": "relative error, last hidden state", "fig_cos": "1 − cos, sentence embedding",
    "fig_groups": "K/V heads after mean-pooling (G)", "fig_pool": "{model} (H = {H}), K/V heads mean-pooled",
}

# qkv explain kv-cache (lessons.kvcache)
KVCACHE = {
    "title": "qkv explain kv-cache · {model}",
    "intro": "An LLM writes one token at a time (guide: temperature), and the new token's query must meet the keys and "
             "values of every token before it. Those K and V never change once computed (a causal mask: no "
             "token sees the future), so the KV cache keeps them instead of recomputing the whole text at every "
             "step, which is what makes writing fast (guide: kv-cache).",

    "s_holds": "① What the cache holds",
    "holds": "Per layer, one K and one V of shape (Hkv, m, d_k): Hkv = {H_kv} K/V heads (the model has H = {H} "
             "query heads, GQA), m tokens so far, d_k = {d_k}; L = {L} layers; keys are stored after RoPE. After "
             "the prompt ({n} tokens: {prompt}) each layer holds K {shape} and V {shape}: 2·L·Hkv·d_k·4 = {per:,} "
             "bytes per token in float32.",
    "holds_check": "The cache after generating equals the K and V a full pass over the same {n} tokens computes, "
                   "in every layer (largest difference {diff:.1e}).",
    "holds_state": "{k} of its {L_all} layers keep a {kind} state instead, of a fixed size: {state:,} bytes in all "
                   "in float32, the same after one token as after 100,000 (KVCache.state_bytes). K and V are kept by "
                   "its {L} attention layers alone, and grow by {per:,} bytes a token.",
    "holds_state_beside": "Each of its {L_all} layers also keeps a {kind} state beside attention's K and V, of a fixed "
                          "size: {state:,} bytes in all in float32, the same after one token as after 100,000 "
                          "(KVCache.state_bytes), while K and V grow by {per:,} bytes a token.",

    "holds_latent": "Multi-head latent attention (MLA): per layer the cache keeps, for each token, its latent c = "
                    "RMSNorm(x·W_V) of r_kv = {r_kv} numbers and its RoPE key k_R of d_rot = {d_rot} numbers, turned and "
                    "shared by all H = {H} heads: not each head's K and V. After the prompt ({n} tokens: {prompt}) each "
                    "layer holds c {c} and k_R {k}: L·(r_kv + d_rot)·4 = {per:,} bytes per token in float32 (L = {L}). "
                    "Every step expands them into each head's K = [K_nope | k_R] (d_nope = {d_nope} numbers of "
                    "c·W_KV_b, d_k = {d_k} in all) and V (d_v = {d_v}, the rest of c·W_KV_b) again. That is what qkv's "
                    "cache and transformers' hold; neither folds W_KV_b into W_Q and W_O (DeepSeek's own inference "
                    "trick), so the expansion is work every step does (③). A cache of the expanded K and V would take "
                    "L·H·(d_k + d_v)·4 = {full:,} bytes per token.",
    "holds_check_latent": "The latents cached while generating, expanded into K and V, equal the K and V a full pass "
                          "over the same {n} tokens computes, in every layer (largest difference {diff:.1e}).",
    "s_steps": "② Token by token: {k} new tokens, greedy",
    "steps": "Step 1 feeds the prompt ({prompt} tokens, the prefill); each later step feeds only the token just "
             "chosen, whose query reads the m cached keys. \"Without\" runs all m tokens again. Times: the fastest "
             "of 3 runs, this machine, now (a one-token step on 1 or 2 BLAS threads, as qkv generates).",
    "col_token": "token", "col_fed": "fed", "col_shape": "K per layer", "col_bytes": "cache",
    "col_ms_cache": "ms, cache", "col_ms_full": "ms, without", "col_flops_cache": "FLOPs, cache",
    "col_flops_full": "FLOPs, without", "col_same": "same token · max |Δlogit|",
    "text": "The text: {text!r}",
    "same": "Both ways choose the same {k} tokens; their logits differ by at most {diff:.1e} (tolerance {tol:g} "
            "of the largest logit): the cache changes the cost, not the result.",

    "s_cost": "③ What a step costs",
    "flops": "FLOPs counted from the weights' shapes, 2 per multiply-add, for a pass feeding f tokens whose "
             "queries read m keys: L·[2·f·d_model·(H + 2·Hkv)·d_k (Q, K, V) + 4·H·f·m·d_k (Q·Kᵀ and A·V) + "
             "2·f·H·d_k·d_model (W_O) + {ffn}·2·f·d_model·d_ff (FFN)] + 2·d_model·V (logits of the last token), "
             "with d_model = {d_model}, H = {H}, Hkv = {H_kv}, d_k = {d_k}, d_ff = {d_ff}, L = {L}, V = {V:,}. "
             "With the cache f = 1; without it f = m.",
    "flops_state": "L = {L} counts the layers that attend, of {L_all}: the {kind} boxes of {k} layers (and the FFNs "
                   "of the layers that do not attend) are left out, since with their state a step costs them the "
                   "same at any m.",
    "flops_latent": "FLOPs counted from the weights' shapes, 2 per multiply-add, for a pass feeding f tokens whose "
                    "queries read m keys: L·[2·f·d_model·(r_q + r_kv + d_rot) + 2·f·r_q·H·d_k (q through its latent, "
                    "2·f·d_model·H·d_k without one; the K/V latent and the RoPE key) + 2·m·r_kv·H·(d_nope + d_v) (every "
                    "cached latent expanded into K and V, at every step) + 2·H·f·m·(d_k + d_v) (Q·Kᵀ and A·V) + "
                    "2·f·H·d_v·d_model (W_O) + {ffn}·2·f·d_model·d_ff (FFN)] + 2·d_model·V (logits of the last token), "
                    "with d_model = {d_model}, H = {H}, r_q = {r_q}, r_kv = {r_kv}, d_rot = {d_rot}, d_nope = {d_nope}, "
                    "d_k = {d_k}, d_v = {d_v}, d_ff = {d_ff}, L = {L}, V = {V:,}. With the cache f = 1; without it f = m.",
    "cost": "At m = {m}: {fc:,.0f}M FLOPs with the cache, {ff:,.0f}M without ({fr:.1f}×). Measured over the {k} "
            "one-token steps: {tc:.0f} ms with the cache, {tf:.0f} ms without ({tr:.1f}×). A step with the cache "
            "costs about the same at any m, one without grows with m (its attention part with m²).",
    "ratio_memory": "The time ratio is smaller than the FLOP ratio: a one-token step reads every weight to do one "
                    "row of work (bound by memory), while a whole pass does m rows per weight it reads (bound by "
                    "arithmetic).",
    "ratio_busy": "Here the time ratio is not below the FLOP ratio, as it is on an idle machine (a one-token step "
                  "is bound by memory, a whole pass by arithmetic): other work on this machine slowed the runs. "
                  "FLOPs do not depend on the machine; times do.",

    "s_layouts": "④ MHA, GQA, MQA: what the same model's cache would hold",
    "col_attention": "attention", "col_kv_heads": "K/V heads", "col_per_token": "bytes per token",
    "col_now": "these {n} tokens", "col_context": "whole context",
    "layouts": "Bytes per token = 2·L·Hkv·d_k·4 (K and V, L = {L} layers, d_k = {d_k}, float32); for the tokens "
               "of this run and for the model's whole context of {context:,} tokens (← this model):",
    "layouts_end": "With one K/V head per query head (MHA, H = {H}) the cache would be {saving:.0f}× larger; "
                   "GQA's {H_kv} shared K/V heads are the model's choice, and MQA (one K/V head) would shrink it "
                   "{mqa:.0f}× from MHA (`qkv explain gqa`).",
    "layouts_state": "Add to each row the {k} {kind} states' {state_h}, whatever the length: over the whole context "
                     "of {context:,} tokens this model's K and V take {kv}, its states still {state_h}.",
    "layouts_latent": "Bytes per token: MLA's own L·(r_kv + d_rot)·4 (L = {L}, r_kv = {r_kv}, d_rot = {d_rot}, "
                      "float32); caching the expanded heads instead, L·Hkv·(d_k + d_v)·4 (d_k = {d_k}, d_v = {d_v}) "
                      "with H K/V heads (MHA) or one (MQA). For the tokens of this run and for the model's whole context "
                      "of {context:,} tokens (← this model):",
    "layouts_end_latent": "The latent takes {saving:.1f}× less than the K and V of the H = {H} heads it stands for "
                          "(MHA); one K/V head for all (MQA) would take {mqa:.2f}× the latent's bytes: MLA keeps a K "
                          "and a V of each head's own (through W_KV_b) at about an MQA cache's size.",

    "fig_full": "without the cache", "fig_cache": "with the cache", "fig_m": "tokens so far m",
    "fig_time": "time of a step (measured)", "fig_flops": "FLOPs of a step (counted)", "fig_tokens": "tokens",
    "fig_memory": "{model}: KV cache, float32", "fig_state": "{kind} states (fixed)",
}

# qkv explain positions (lessons.positions)
POSITIONS = {
    "title": "qkv explain positions · {model}",
    "intro": "Attention by itself is blind to order: shuffle the tokens and every score S[i, j] stays the same. "
             "So a model adds where each token is (guide: positions): the first transformer added sine/cosine waves to X, "
             "BERT a learned table, and most modern LLMs turn Q and K by their position (RoPE). This model uses "
             "{kind}.",
    "kind_rope": "RoPE", "kind_learned": "a learned table", "kind_sinusoidal": "the sinusoidal table",
    "kind_relative": "a learned bias per distance bucket (T5)",
    "kind_alibi": "ALiBi: a fixed bias on the scores, each head's slope times the key's position (BLOOM, Falcon)",

    "s_sin": "① The sinusoidal table (Vaswani et al. 2017)",
    "sin_what": "PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)), with d = d_model = {d}: "
                "each pair of columns is a wave, the first turning 1 radian per position, the last "
                "{w_last:.1e}. The first positions (heatmap: --out, shape {shape}):",
    "col_pos": "p", "col_closed": "Σ cos(k·ω_i)",
    "sin_check": "qkv.core.positions.sinusoidal_table equals the formula computed in float64 (largest difference "
                 "{diff:.1e}).",
    "sin_dot": "Why waves: the dot product of two positions' encodings, PE(p)·PE(p+k) = Σ_i cos(k·ω_i) over the "
               "{half} pairs, depends on the distance k only, not on p:",
    "sin_dot_end": "The same at every p (largest difference over p {spread:.1e}) and equal to Σ cos(k·ω_i). It "
                   "is largest at k = 0 (d/2 = {d}/2) and falls as the tokens move apart ({far:.1f} at k = 64).",

    "s_rope": "② RoPE: Q and K turned by their position",
    "no_rope": "{model} has no RoPE (it uses {kind}); run `qkv explain positions --model smollm2` to see it on an "
               "LLM.",
    "rope_what": "RoPE adds nothing to X. It turns each query and key: the d_k = {d_k} numbers form {half} pairs "
                 "(i, i + {half}), and pair i turns by the angle p·ω_i, ω_i = θ^(−2i/d_k), θ = {theta:g}. Fast "
                 "pairs tell near positions apart, slow ones far ones. Angles in radians:",
    "col_pair_i": "pair i", "col_wave": "wavelength (tokens)",
    "rope_omega_check": "qkv.core.positions.rope_inv_freq equals θ^(−2i/d_k) in float64 (largest difference "
                        "{diff:.1e}).",
    "rope_turn": "One real query: layer {layer}, head {head}, the token “{token}” (its key comes from K/V head "
                 "{kv}). The same vector placed at positions 0, 1, 2, 3: each pair turns, the length |q| stays.",
    "col_pair": "pair ({i}, {j})",
    "rope_trace_check": "The query and key recomputed before RoPE and turned by the engine's RoPE to their real "
                        "positions equal the model's q and k (largest difference {diff:.1e}).",
    "rope_relative": "Now fix the content: the query of “{q}” (position {qp} in the text) and the key of “{k}” "
                     "(position {kp}), and place them anywhere: q at p + k, the key at p. q·k:",
    "rope_relative_end": "Each row is the same at every p: after RoPE, q·k depends on the distance k only (largest "
                         "difference over p {spread:.1e} with the engine's float32 angles, {spread64:.1e} in "
                         "float64; the engine against float64: {diff:.1e}). The content decides how the "
                         "score moves with k, here from {lo:.1f} to {hi:.1f} over k = 0..64.",

    "s_learned": "③ A learned table: {model}",
    "learned_what": "{model} learned one vector per position, P {shape}, and adds P[p] to the token's embedding. "
                    "Nothing in training makes P[p]·P[p+k] a function of k. The cosine of two rows against "
                    "their distance, over every p:",
    "learned_check": "X of layer 0 recomputed as E[ids] + P[positions] (+ segment, then LayerNorm) equals the "
                     "model's (largest difference {diff:.1e}): this table is what the model adds.",
    "col_mean_cos": "mean cos", "col_min": "smallest", "col_max": "largest",
    "learned_end": "Near positions are alike and far ones less so, as with the waves, but only on average: at the "
                   "same distance the cosine differs from p to p. {model} also cannot read past its last row.",
    "end": "Sinusoids and RoPE make the score a function of the distance by construction; a learned table can "
           "only approximate it. RoPE does it inside q·k, where attention compares tokens.",

    "fig_dim": "pair i: sin(p·ω_i) on the left, cos(p·ω_i) on the right", "fig_pos": "position p",
    "fig_dist": "distance k",
    "fig_sin_table": "PE(p, 2i) | PE(p, 2i+1), d = {d}", "fig_sin_dot": "PE(p)·PE(p+k): the same curve for every p",
    "fig_pair": "pair", "fig_angle": "angle p·ω_i mod 2π (rad)", "fig_rope_angle": "RoPE angles, θ = {theta:g}",
    "fig_rope_dot": "q·k after RoPE, layer {layer} head {head} ({q} → {k})\nthe same curve for every p",
    "fig_learned_cos": "{model}: cos(P[p], P[p'])", "fig_range": "smallest..largest over p",
    "fig_mean": "mean over p", "fig_learned_dist": "learned: only roughly a function of k",
}

# qkv explain sparse (lessons.sparse)
SPARSE = {
    "title": "qkv explain sparse · {model} · n = {n} tokens",
    "intro": "Full attention scores every query against every key: n² pairs, the O(n²) of the score matrix (guide: scores). A sparse "
             "pattern keeps a few keys per query and adds M = −∞ to the others. Adding M to the whole n × n "
             "matrix saves nothing; the tiled kernel (FlashAttention's online softmax, see `qkv explain flash`) "
             "asks the pattern, tile by tile, whether a tile of (query block, key block) is hidden entirely, "
             "and skips it: no Q·Kᵀ, no exp, no P·V.",
    "s_own": "⓪ The model's own masks: what each layer used",
    "own": "{model} attends sparsely itself. Each layer's mask on these n = {n} tokens (0: hidden; 1: seen; 2 or more: "
           "a key its kernel counts that many times — BigBird's eval mode reads block 0 as each of its random "
           "blocks), and the error of softmax(Q·Kᵀ/√d_k + log c)·V on the layer's own q, k, v (Longformer's global rows "
           "from their own Q, K, V) against the model's output Z:",
    "col_layer": "layer", "col_mask": "mask", "col_copies": "most copies", "col_own_error": "error of Z",
    "own_end": "An error of 0 (float rounding) is the check that the mask drawn is the one the model ran. The "
               "gallery below is measured against the dense attention of the same q, k, v, which this model does not "
               "run.",
    "fig_own": "{model}, n = {n}: the mask each layer used (dark: a key counted twice or more)",
    "fig_own_kept": "{d:.1%} of pairs · error of Z {e:.0e}",
    "s_gallery": "① The gallery: which keys each query sees",
    "gallery": "Tiles of {block} × {block} over n = {n} ({causal}). A tile is computed without a mask when the "
               "pattern keeps all of it, with the mask when it keeps part, and skipped when it keeps none:",
    "mode_causal": "causal: a token never sees a later one",
    "mode_not_causal": "not causal: every token may see every other",
    "col_pattern": "pattern", "col_defined": "as defined (qkv.core.sparse)", "col_density": "pairs kept",
    "col_tiles": "tiles computed", "col_skipped": "skipped",
    "gallery_end": "The kernel's count of skipped tiles equals the tiles the pattern hides (checked). Window, "
                   "dilated and block patterns keep O(n·w) pairs; global tokens add a row and a column; BigBird's "
                   "random blocks reach far for a fixed cost per query block.",
    "s_error": "② What each pattern loses on the real model",
    "error": "{model} reads a paragraph of {one} tokens repeated {copies} times (n = {n}); every layer's q, k, v "
             "from the trace go through each pattern. Error: ‖Z_sparse − Z‖ / ‖Z‖ against the model's own output "
             "Z, mean over the {H} heads, then over the {L} layers (and the worst layer). Mass kept: the share of "
             "the model's attention weights A that falls on the keys the pattern keeps.",
    "col_error": "error of Z", "col_worst": "worst layer", "col_mass": "mass of A kept",
    "error_check": "Checked: the dense pattern gives the model's Z on every layer (largest difference {dense:.1e}); "
                   "each pattern's Z equals the model's A cut to the pattern, renormalised row by row, times V "
                   "(largest difference {worst:.1e}): softmax over the kept keys is exactly that.",
    "sink": "Rows more than w = {w} tokens in: the first token alone gets {first:.1%} of their weight on "
            "average (an “attention sink”). The window keeps {win:.1%} of the weight; the window plus the first "
            "token as a global token keeps {lf:.1%}. Error of Z: {e_win:.3f} → {e_lf:.3f}.",
    "s_cost": "③ Cost against n",
    "cost": "One call on random q, k, v of this model's shape (H = {H} query heads, {H_kv} K/V heads, d_k = {d}, "
            "float32): time (median of {repeats} rounds taking turns) · peak memory the call allocated "
            "(tracemalloc). Tiles of {block}.",
    "col_method": "method", "m_dense": "dense + mask", "m_tiled": "tiled (engine)", "m_causal": "causal (dense)",
    "m_full": "full (dense)",
    "m_window": "sliding window", "m_dilated": "dilated window", "m_longformer": "Longformer", "m_bigbird": "BigBird",
    "m_block": "block-sparse",
    "cost_end": "Dense + mask holds H·n² scores and does all n² pairs of work whatever the mask. The tiled kernels "
                "hold a few tiles per query block, so their memory grows like n; a sparse pattern computes "
                "fewer tiles. Larger n: `qkv bench sparse`. Each call's output equals the dense masked one "
                "(checked).",
    "fig_gallery": "Sparse attention masks, n = {n}: blue = key seen; grey tiles ({block} × {block}) are skipped",
    "fig_kept": "{d:.1%} of pairs · {v} of {T} tiles computed",
    "fig_key": "key j", "fig_query": "query i",
    "fig_layer": "layer",
    "fig_error": "{model}, n = {n}: error of Z against full attention",
    "fig_mass": "share of the model's attention weights kept",
    "fig_mass_axis": "mass of A kept",
    "fig_time": "time of one call", "fig_memory": "peak memory of one call (tracemalloc)",
}

# qkv explain vit (lessons.vit)
VIT = {
    "title": "qkv explain vit · {model}",
    "intro": "A Vision Transformer (ViT) reads an image as a sequence: it cuts the image into patches, turns each "
             "patch into a token vector, and from there runs the same blocks as a text model (guide: block). The "
             "answer is read from one extra token, [CLS]. Followed here: {image}, through {model} ({h} × {w} pixels, "
             "{rows} × {cols} patches of {ph} × {pw}, L = {L}, H = {H}, d_model = {d}).",
    "example": "{name}, an example digit shipped with {model}",

    "s_pixels": "① The image as pixels",
    "pixels": "The image as the model reads it (resized to its {h} × {w} first if it is another size): grey "
              "values from 0 (black) to 255 (white). Left as ink, right as numbers:",
    "pixels_rgb": "The image as the model reads it (resized to its {h} × {w} first if it is another size), {C} "
                  "channels: drawn from their mean, the numbers of channel 0, from 0 (dark) to 255 (bright):",
    "pixels_big": "The image is {h} × {w} pixels; shown here is its top-left corner, {sh} × {sw}:",
    "normalise": "The model reads each value v as x = (v/255 − {mean:g}) / {std:g}: white 255 → {white:+.2f}, "
                 "black 0 → {black:+.2f}. pixel_values {shape}:",
    "normalise_check": "Equal to the engine's pixel_values (largest difference {diff:.1e}).",

    "s_patches": "② Cut into a {rows} × {cols} grid of {ph} × {pw} patches",
    "patches": "Patch (r, c) holds the pixels of rows {ph}·r … {ph}·r + {ph1} and columns {pw}·c … {pw}·c + {pw1}, "
               "read channel by channel, row by row into C·{ph}·{pw} = {k} numbers. The {P} patches, row by row, "
               "are the image's tokens:",
    "patches_more": "… and {more} more patches.",
    "col_patch": "patch", "col_rows": "rows", "col_cols": "columns", "col_values": "its numbers",
    "patches_check": "Equal to the engine's patches (qkv.inputs.images.patches_of; largest difference {diff:.1e}).",

    "s_embed": "③ Each patch becomes a token: X = [CLS; patches·W_patch + b_patch] + positions",
    "embed": "Where a text model looks up a row of its embedding table E, a ViT multiplies: token = "
             "patch·W_patch + b_patch, with W_patch {ws}, so {k} numbers become d_model = {d}. The darkest patch, "
             "{patch}:",
    "conv": "The checkpoint stores W_patch as a convolution: {d} filters of {C} × {ph} × {pw}, moved {ph} rows "
            "and {pw} columns at a time. Its windows do not overlap and each sees one patch, so the convolution is "
            "the product above. Computed window by window, it gives the same {P} × {d} tokens (largest difference "
            "{diff:.1e}).",
    "cls": "Before the patches comes [CLS]: a learned vector, the same for every image, that reads the other "
           "tokens and will carry the answer. Then every position adds its row of the learned position table "
           "{ps}: attention by itself sees a set, and the position rows tell the model where each patch lay. "
           "X {xs}:",
    "row_cls": "[CLS] + P[0]", "row_patch": "{patch} + P[{i}]",
    "embed_check": "X equals the engine's residual stream entering layer 0 (largest difference {diff:.1e}).",

    "s_attn": "④ Attention over patches: where [CLS] looks in layer {layer}",
    "attn": "From here on it is the attention of every text model: Q, K, V = Norm(X)·W + b, S = Q·Kᵀ/√d_k, "
            "A = softmax(S), one per head. Row 0 of A is where [CLS] looks. Laid on the {rows} × {cols} grid of "
            "patches, the weight of each patch in %, per head (what [CLS] keeps for itself is the rest):",
    "head_grid": "head {head} ([CLS] {own:.0%})",
    "head_row": "Head {head} puts the most on one patch: {w:.0%} on {patch}. Its [CLS] row, computed: "
                "s_j = q_[CLS]·k_j / √{d_k}, then softmax; the {top} largest:",
    "col_key": "key", "col_score": "score s_j", "col_exp": "exp(s_j − max s)", "col_weight": "weight a_j",
    "attn_sum": "The {n} exponentials sum to {total:.4f}; each weight is its exponential divided by that sum, so "
                "the row sums to {one:.6f}.",
    "attn_check": "The scores and weights of all {H} heads in layer {layer}, recomputed from the weights, equal the "
                  "engine's (largest difference: scores {ds:.1e}, weights {da:.1e}).",

    "s_rollout": "⑤ Attention rollout: what reaches [CLS] through all {L} layers",
    "rollout": "One layer's attention is one step, and [CLS] is read after {L} of them. Rollout (Abnar & Zuidema "
               "2020) multiplies the layers: Â = ½·mean_h A + ½·I (the residual as attention to oneself), "
               "R = Â_{L} ⋯ Â_1. Row 0 of R over the patches is how much each patch reaches [CLS], in % ([CLS] "
               "itself: {own:.0%}):",
    "rollout_end": "Most comes from {patch} ({w:.0%}). Equal to qkv's attention_rollout (qkv.analysis.rollout; "
                   "largest difference {diff:.1e}).",

    "s_classify": "⑥ The answer: the classifier reads [CLS]",
    "classify": "After the {L} blocks comes the final LayerNorm, and then only row 0 is read: logits = "
                "Norm(x_[CLS])·W_vocab + b_vocab, with W_vocab {ws}: one score per label. softmax turns the "
                "scores into probabilities:",
    "col_label": "label", "col_logit": "logit", "col_prob": "probability",
    "classify_end": "{model} answers {label} ({p:.1%}).",
    "classify_true": "{model} answers {label} ({p:.1%}); the example is a handwritten {true}.",
    "classify_check": "The whole pass was redone here in float64 from the weights (each block's LayerNorms, "
                      "attention, W_O and {act} FFN). The residual stream entering every layer equals the engine's "
                      "(largest difference {dr:.1e}), and the logits equal the engine's trace.logits[0] (largest "
                      "difference {dl:.1e}).",

    "fig_image": "{image}: {rows} × {cols} patches", "fig_head": "layer {layer}, head {head}: [CLS] → patches",
    "fig_rollout": "rollout through {L} layers: patches → [CLS]", "fig_probs": "softmax of the logits",
    "fig_title": "{model}: an image as {P} patch tokens after [CLS]",
}

# the viewer's tabs beyond attention weights (`viz.panels`: each panel's title; the viewer speaks English only)
VIEWER = {
    "panel_lens": "Logit lens", "panel_rollout": "Rollout", "panel_patch": "Patching",
    "panel_attribute": "Attribution", "panel_causal_trace": "Causal trace", "panel_features": "Features",
    "panel_router": "Experts",
    "panel_diff": "Model diff",
    "panel_path_patch": "Path patching", "panel_probe": "Probes",
    "panel_disentangled": "Disentangled",
    "panel_contacts": "Contacts",
}

# the attribution graph page (`graphs.page`, assets/graph.js) and `qkv serve`'s Graph tab
GRAPH = {
    "title": "Attribution graph · {model}",
    "prompt": "Prompt", "target": "Target", "none": "none",
    "lang": "한국어",
    "mode_subgraph": "Keep sub-graph", "mode_select": "Select", "mode_path": "Pin path",
    "hint_subgraph": "Hover a node for its card. Click a node to keep its ancestors and descendants; click the "
                     "background to see every node again.",
    "hint_select": "Click nodes to select them (Shift+click works in every mode), name the group and press Group: "
                   "its nodes become one supernode, their edges summed.",
    "hint_path": "Click a node to pin the strongest path through it: from it, each step down takes its strongest "
                 "incoming edge and each step up its strongest outgoing edge (by |weight|).",
    "show_all": "Show all", "kept": "{count} of {total} nodes kept",
    "group": "Group", "group_name": "supernode name", "ungroup": "Ungroup", "supernodes": "Supernodes",
    "selected": "{count} selected", "need_two": "Select two or more nodes first.",
    "default_group": "group {n}",
    "path": "Pinned path", "clear_path": "Clear path", "no_path": "Click a node in “Pin path” mode to pin a path.",
    "scores": "Scores", "unpruned": "graph", "pruned": "pruned",
    "replacement": "replacement", "completeness": "completeness", "not_computed": "—",
    "thresholds": "pruned at node threshold {node} and edge threshold {edge}",
    "counts": "{nodes} nodes ({features} features, {errors} error nodes, {logits} logits) and {links} edges drawn",
    "dropped": "{shown} of the graph's {total} edges are drawn (the strongest).",
    "kind_embedding": "embedding", "kind_feature": "feature", "kind_error": "error", "kind_logit": "logit",
    "kind_super": "supernode",
    "layer": "layer", "row_embedding": "emb", "row_logit": "logits",
    "card_empty": "Hover a node to see what it is.",
    "card_feature": "feature {feature} · layer {layer} · position {position} (“{token}”)",
    "card_embedding": "the embedding of “{token}” · position {position}",
    "card_error": "error node · layer {layer} · position {position} (“{token}”): what the transcoder missed",
    "card_logit": "logit of “{token}” (id {id}) · p = {p}",
    "card_super": "supernode “{name}” · {count} nodes",
    "activation": "activation", "influence": "influence", "norm": "norm", "logit": "logit",
    "promotes": "promotes", "suppresses": "suppresses", "contexts": "top contexts",
    "no_annotation": "No annotation for this feature: annotate the graph with a corpus to see its contexts.",
    "inputs": "strongest inputs", "outputs": "strongest outputs",
    "legend": "Edge width ∝ |weight|: red adds to its target, blue takes away. Rows: layers (embeddings at the "
              "bottom, logits at the top); columns: positions.",
    "export": "Export", "saved": "saved {name}",
    "open": "Open a graph JSON (qkv graph … --json FILE), or drop one here",
    "compute": "Graph of this prompt", "computing": "computing the graph (a backward pass per batch of nodes) …",
    "bad_file": "This file is not a graph qkv can draw: {why}",
}

# qkv explain circuits (graphs.lesson)
CIRCUITS = {
    "title": "qkv explain circuits · {model} · layer {layer} of {L} · “{token}”",
    "intro": "An attribution graph explains one prediction as a circuit: each FFN is rewritten as a transcoder "
             "(sparse features you can read), attention patterns and norm scales are held at the real pass's, and "
             "what is left is linear, so every edge, one node's direct effect on another, is exact. One small graph, "
             "step by step.",
    "s_box": "① The FFN box at layer {layer}, “{token}”, and its transcoder",
    "box": "The FFN reads h (after its norm, d_model = {d_model}) and writes y, what joins the stream. A transcoder "
           "is the same box rewritten: it reads h, keeps a few of {d_sae} features ({arch}), z = act(h·W_enc + "
           "b_enc), and writes ŷ = z·W_dec + b_dec.",
    "box_plain": "Each feature f that fires adds z_f·W_dec[f]: a readable part of what the FFN writes.",
    "box_skip": "This transcoder also has a linear skip: ŷ = z·W_dec + b_dec + h·W_skip.",
    "box_error": "What it misses is the error e = y − ŷ: ‖e‖/‖y‖ = {rel:.3f} (a fraction {fvu:.3f} of ‖y‖²). The "
                 "graph keeps e as an error node, so that nothing the FFN wrote is lost.",
    "box_check": "Checked: y redone from the FFN's weights in float64 (difference {ffn:.1e}); z and ŷ redone in "
                 "float64 ({recon:.1e}); ŷ + e = y ({sum:.1e}).",
    "s_features": "② The features active here",
    "features": "{n} of {d_sae} features fire at this token; the top {top}, each with the tokens its decoder row "
                "W_dec[f] promotes (through the final norm's γ and W_vocab, as the logit lens reads the stream):",
    "col_feature": "feature", "col_z": "activation z", "col_promoted": "promotes",
    "features_end": "Checked: every logit of those rows redone in float64 from W_vocab.",
    "s_replacement": "③ The local replacement model",
    "replacement_model": "Hold every attention pattern and every norm's scale at the real pass's, and replace each "
                         "FFN by its transcoder plus its error: on this prompt it is the model, and every path from "
                         "a node to a logit is a product of linear maps.",
    "replacement_check": "Its logits against the model's: the largest difference is {diff:.1e}. The top next token is "
                         "{token} (p = {prob:.3f}).",
    "s_edge": "④ One edge into the logit of {token}",
    "edge_target": "The logit node's input is logit − mean logit = {value:+.4f}; {n} nodes have a direct edge into it.",
    "edge_strongest": "The strongest: {source}, {share:.1%} of the incoming |edges|.",
    "edge_feature": "The strongest from a feature: {source}, {share:.1%} of the incoming |edges|.",
    "src_feature": "feature {f} of layer {layer} at position {pos} (“{token}”)",
    "src_error": "the error node of layer {layer} at position {pos} (“{token}”)",
    "src_embedding": "the embedding at position {pos} (“{token}”)",
    "edge_means": "An edge is the source's value times the gradient of the target's input at where the source "
                  "writes, through the frozen system only (no other feature may respond): a direct effect.",
    "edge_held": "Checked another way: hold every FFN output, take this source's vector out, run the frozen pass: "
                 "the input moves by {moved:+.4f}, so the edge is {held:+.4f} (difference {diff:.1e}).",
    "edge_sum": "All incoming edges sum to {edges:+.4f}; with the constant {const:+.4f} (the biases, which no edge "
                "carries) that is {total:+.4f}, the input {value:+.4f} (difference {diff:.1e}).",
    "error_nodes": "Error nodes exist because the transcoders are not exact: each is a constant vector the features "
                   "do not explain. Without them the replacement would not give the model's logits, and the edges "
                   "would not add up.",
    "s_scores": "⑤ How much of the graph the features explain",
    "nodes": "The graph: {features} feature nodes, {errors} error nodes, {embeddings} embeddings, {logits} logits.",
    "score_replacement": "replacement = {v:.3f}: of the influence that reaches the logits, the share that starts at "
                         "the tokens rather than at the error nodes.",
    "score_completeness": "completeness = {v:.3f}: of every node's inputs, weighted by its influence, the share that "
                          "comes from nodes rather than from errors.",
    "scores_check": "Checked: both redone layer by layer in float64 (difference {diff:.1e}).",
    "next": "The whole graph, pruned, with its page: qkv graph TEXT --transcoders DIR --page graph.html",
}

# qkv explain patching (lessons.patching)
PATCHING = {
    "title": "qkv explain patching · {model}",
    "intro": "Which heads carry the answer? Three ways to ask, on one prompt pair: exact activation patching (rerun "
             "the model with one head's output swapped), attribution patching (AtP: the same swap estimated from "
             "gradients, every head at once) and path patching (the swap sent along one path only). One head, "
             "followed through all three.",
    "clean": "clean", "corrupted": "corrupted",
    "s_metric": "① The metric",
    "pair": "Clean: {clean!r}. Corrupted: {corrupted!r}. Both are {n} tokens, so position p of one lines up with "
            "position p of the other.",
    "metric": "m = logit({answer}) − logit({wrong}) at the last position: how much more the model expects the clean "
              "answer than the corrupted one.",
    "col_prompt": "prompt",
    "metric_check": "Checked: m from the whole forward pass's logits equals patching's own (difference {diff:.1e}).",
    "s_exact": "② Exact patching of head {layer}.{head}",
    "exact": "Run the corrupted prompt again, but with head {layer}.{head}'s output Z = A·V (every position) copied "
             "from the clean run; everything after it is recomputed.",
    "exact_auto": "Of all {L} × {H} heads (the last layer's left out: they send to no later head), this "
                  "one's patch moves m most.",
    "exact_means": "0 would mean the head carries nothing of the difference; 1, that it alone brings the clean "
                   "answer back. This head brings back {exact:.1%} of it.",
    "exact_check": "Checked: a whole forward pass with a hook on this head's Z gives the same number as patch's table "
                   "(difference {diff:.1e}).",
    "s_atp": "③ Attribution patching (AtP) of head {layer}.{head}",
    "atp": "Exact patching needs one rerun per head. AtP needs two forward passes and one backward for all of them: "
           "m(patched) − m(corrupted) ≈ (a_clean − a_corrupted)·∂m/∂a, the gradient taken at the corrupted run. "
           "Here a is the head's Z ({n} positions × d_k = {d_k}); it moves at {moved} positions (‖Δa‖ = {norm:.4f}). "
           "The dot product is a sum over positions; the largest terms:",
    "col_position": "position", "col_token": "token",
    "others": "the other {k}",
    "atp_check": "Checked: each term measured without a backward pass (a small step ±ε along Δa_p, a central "
                 "difference); their sum, divided, equals atp's cell (difference {diff:.1e}).",
    "line": "Why {estimate:+.4f} and not {exact:+.4f}: AtP draws a straight line from the corrupted run with the "
            "slope it has there. The real m along the way from Z_corrupted to Z_clean (Z_corrupted + t·ΔZ) bends: "
            "later attention and the final norm are not linear.",
    "col_m_real": "m (real)", "col_m_line": "m (AtP's line)",
    "line_check": "Checked: t = 0 is the corrupted run and t = 1 is ②'s patched run (difference {diff:.1e}).",
    "table": "Over all {cells} heads, AtP against exact: Pearson r = {r:.3f}, the same sign for {sign:.0%} of them, "
             "off by more than half of the exact number for {off}. AtP ranks heads cheaply; the heads it ranks "
             "high are then patched exactly.",
    "table_check": "Checked: r and the sign share redone from their formulas (difference {diff:.1e}).",
    "s_path": "④ Path patching: head {layer}.{head} → the queries of head {rl}.{rh}",
    "path": "Patching a head changes everything after it. Path patching asks about one route: what head "
            "{layer}.{head} sends straight through the residual stream into the queries of head {rl}.{rh} (of "
            "every later head's queries, the ones this path moves m most through). As Wang et al. do, it goes the "
            "other way: the corrupted output into the clean run.",
    "path_frozen": "Frozen at the clean run: every other head and FFN, and {rl}.{rh}'s keys and values. Changed: "
                   "{rl}.{rh}'s query input, x_clean + Δ, where Δ is what {layer}.{head}'s corrupted Z changes its "
                   "layer's output by. Recomputed: {rl}.{rh}'s pattern and output, and everything after it.",
    "path_whole": "Head {layer}.{head}'s whole effect in this direction (its corrupted Z in the clean run, every path) "
                  "is {noising:+.4f}; through this one path alone it is {path:+.4f}. A head's paths need not add up to "
                  "its whole effect, and one path may even push the other way.",
    "path_check": "Checked: done by hand (Δ from a hooked pass, {rl}.{rh}'s queries from a pass on x_clean + Δ, "
                  "hooked into a clean pass) it equals path_patch's and its cell of the table over every later head; "
                  "the whole effect equals patch_one's (difference {diff:.1e}).",
    "s_side": "⑤ Side by side",
    "col_method": "method", "col_number": "effect", "col_answers": "the question it answers",
    "m_exact": "exact patching", "m_atp": "AtP", "m_path": "path patching",
    "m_noise": "the head corrupted",
    "a_exact": "how much of the clean answer head {layer}.{head} alone brings back to the corrupted run",
    "a_atp": "the same, to first order: cheap for every head at once, wrong where m bends",
    "a_path": "how much of the answer flows through this head into head {rl}.{rh}'s queries",
    "a_noise": "how much the answer drops when this head alone is corrupted (every path)",
    "side": "Every effect is a fraction of m(clean) − m(corrupted): + towards the clean answer, − towards the "
            "corrupted one. Exact patching and AtP put the clean head into the corrupted run; path patching and the "
            "corrupted head put the corrupted head into the clean run, so there a head that carries the answer "
            "shows as −.",
    "next": "The whole tables: qkv patch, qkv atp, qkv path-patch (each with --json and --out).",
    "fig_exact": "exact patching", "fig_atp": "AtP", "fig_scatter": "{model}: {cells} heads, r = {r:.3f}",
    "fig_real": "m (real)", "fig_linear": "AtP's line", "fig_t": "t (Z_corrupted + t·ΔZ)",
    "fig_line": "head {layer}.{head}: from corrupted (t = 0) to clean (t = 1)",
}

LINEAR = {
    "title": "qkv explain linear · {model}",
    "intro": "Softmax attention builds the n × n matrix A = softmax(Q·Kᵀ/√d_k + M) and then reads A·V: its cost "
             "and memory grow with n². Linear attention drops the softmax for a product of features, A[t, s] ∝ "
             "φ(qₜ)·φ(kₛ), so (φ(Q)·φ(K)ᵀ)·V can be regrouped as φ(Q)·(φ(K)ᵀ·V): the n × n matrix is never built, "
             "and a d_k × d_v state S = Σₛ φ(kₛ)·vₛᵀ, carried along the text, gives each token's output as "
             "φ(qₜ)·S.",
    "s_matrix": "① The matrix it never builds: layer {layer}, head {head}",
    "matrix_kernel": "{model} is a softmax model. Its own q, k, v of head {head} in layer {layer}, reading "
                     "{text!r} ({n} tokens), through φ(x) = elu(x) + 1 (Katharopoulos et al. 2020): A[t, s] = "
                     "φ(qₜ)·φ(kₛ) for s ≤ t, each row divided by its sum (the first rows and columns):",
    "matrix_lightning": "{model}'s layer {layer} is lightning attention (MiniMax): no softmax, no RoPE, no 1/√d_k; "
                        "head {head}'s output is oₜ = Σ_(s ≤ t) (qₜ·kₛ)·λ^(t−s)·vₛ, a fixed decay λ per head. On "
                        "{text!r} ({n} tokens) the matrix it implies, A[t, s] = (qₜ·kₛ)·λ^(t−s) (the first rows "
                        "and columns; signed, its rows do not sum to 1):",
    "matrix_mamba": "{model}'s layer {layer} is a selective scan (Mamba): channel {head}'s output is yₜ = Σ_(s ≤ "
                    "t) α[t, s]·x̃ₛ, α[t, s] = Cₜ·(Π exp(Δᵣ·A))·Bₛ·Δₛ (Ali et al. 2024), a matrix of that channel. "
                    "On {text!r} ({n} tokens), the first rows and columns:",
    "matrix_delta": "{model}'s layer {layer} is a gated delta layer (Qwen3-Next): value head {head}'s state is "
                    "rewritten at each token, Sₜ = exp(gₜ)·(I − βₜ·k̂ₜk̂ₜᵀ)·Sₜ₋₁ + βₜ·k̂ₜ·vₜᵀ, and read as oₜ = "
                    "Sₜᵀ·q̂ₜ. Unrolled, oₜ = Σ_(s ≤ t) A[t, s]·vₛ with A[t, s] = q̂ₜᵀ·Uₜ[:, s], the keys Uₜ = "
                    "[exp(gₜ)·(I − βₜ·k̂ₜk̂ₜᵀ)·Uₜ₋₁ | βₜ·k̂ₜ]. On {text!r} ({n} tokens), the first rows and "
                    "columns:",
    "softmax_beside": "Beside it, the model's own softmax weights of the same head:",
    "check_kernel": "Checked: A·V equals qkv.core.kernels.linear_attention, which never builds A (largest "
                    "difference {diff_matrix:.1e}); the model's softmax weights times V are its head's output "
                    "({diff_output:.1e}).",
    "check_lightning": "Checked: the matrix is the one the model records as the layer's scores ({diff_matrix:.1e}; "
                       "its attentions, what the views draw, are |A| as shares of each row), and A·V is the "
                       "layer's output of the head, which the model sums in blocks with a state, never building A "
                       "({diff_output:.1e}).",
    "check_mamba": "Checked: α equals the engine's blocked form ({diff_matrix:.1e}), and α·x̃ is the scan's "
                   "output, which the model computes step by step with a state ({diff_output:.1e}).",
    "check_delta": "Checked: the matrix recomputed here from the keys Uₜ is the engine's implied attention "
                   "({diff_matrix:.1e}), and A·V is the delta rule's output, which the model computes step by step "
                   "with a state ({diff_output:.1e}).",
    "s_state": "② The state it carries instead",
    "state_kernel": "After the {n} tokens the state is S = Σₛ φ(kₛ)·vₛᵀ, a {d_k} × {d_v} matrix, and z = Σₛ φ(kₛ) "
                    "the rows' sums: {dd} numbers per head whatever n, against the {nn} of the n × n matrix (the "
                    "smaller from n = {cross} tokens on; at 8,192 tokens A would hold 67,108,864). The last "
                    "token's output φ(q)·S / φ(q)·z equals the last row of A·V (largest difference "
                    "{diff_row:.1e}).",
    "state_lightning": "After the {n} tokens the state is S = Σₛ λ^(n−1−s)·kₛᵀ·vₛ, a {d_k} × {d_v} matrix: {dd} "
                       "numbers per head whatever n, against the {nn} of the n × n matrix (the smaller from n = "
                       "{cross} on). Each new token costs S ← λ·S + kᵀ·v and o = q·S. The last token's q·S equals "
                       "the last row of A·V (largest difference {diff_row:.1e}).",
    "state_mamba": "After the {n} tokens the channel's state is h, {d_k} numbers (Mamba's d_state) whatever n, "
                   "against the {nn} of the n × n matrix: each new token costs h ← exp(Δ·A)⊙h + Δ·x̃·B and y = "
                   "h·C. The last token's h·C equals the last row of α·x̃ (largest difference {diff_row:.1e}).",
    "state_delta": "After the {n} tokens the state is S, a {d_k} × {d_v} matrix: {dd} numbers per value head "
                   "whatever n, against the {nn} of the n × n matrix (the smaller from n = {cross} on). The last "
                   "token's Sᵀ·q̂ equals the last row of A·V (largest difference {diff_row:.1e}).",
    "state_cache": "It is the state the model's own cache holds for this layer after reading the text (largest "
                   "difference {diff:.1e}): writing keeps S, not every past K and V.",
    "s_decay": "③ How far each head remembers",
    "decay": "Each head's λ (MiniMax's slopes, ALiBi's, fading with depth): a key's weight is multiplied by λ per "
             "token between it and the query, so it has halved after the number of tokens in the last column.",
    "col_head": "head",
    "col_decay": "λ",
    "col_half": "tokens to halve",
    "s_compare": "③ How far linear is from softmax, every layer",
    "compare": "Every head of every layer of {model}, its own q, k, v through φ instead of the softmax, as qkv "
               "bench --linear measures it: the relative error ‖linear − softmax‖ / ‖softmax‖ of the heads' "
               "outputs and their cosine, the mean over heads:",
    "col_layer": "layer",
    "col_rel": "rel. error",
    "col_cos": "cosine",
    "compare_end": "The worst is layer {layer} ({rel:.2f}): a model trained with the softmax does not read its "
                   "keys as a linear kernel would. Models built on linear attention learn their q, k, v for it: "
                   "try --model with a MiniMax or Mamba checkpoint.",
    "end_kernel": "Linear attention trades the softmax's sharp choices for a state whose size does not grow with "
                  "the text.",
    "end_lightning": "MiniMax keeps a few softmax layers among its lightning ones: they read the past exactly, the "
                     "lightning ones cheaply.",
    "end_delta": "The delta rule writes each value over what the state already held at its key (I − β·k̂k̂ᵀ): a "
                 "linear attention that can overwrite, not only add.",
    "end_mamba": "A Mamba layer is a linear attention whose decay is chosen by each token (Δ), channel by channel.",
    "fig_linear": "linear: layer {layer}, head {head}",
    "fig_softmax": "softmax: layer {layer}, head {head}",
    "fig_state": "state ({d_k} × {d_v})",
    "fig_title": "{model}: the matrix never built, and the state carried ({n} tokens)",
}


PROTEINS = {
    "title": "qkv explain proteins · {model}",
    "intro": "A protein is a chain of amino acids that folds in 3-D; residues far apart in the chain can touch. A "
             "protein language model (ESM-2) is trained only on sequences, to guess masked residues. Residues "
             "that touch change together over evolution (a mutation on one side is compensated on the other), so "
             "to guess a masked residue a head does well to look at its contact partners: such a head's attention "
             "map is a contact map. Rao et al. (2020) showed it: a logistic regression over every head's "
             "symmetrised, APC-corrected map, fit on a handful of known structures, predicts contacts as well as "
             "methods built on alignments of many related sequences.",
    "s_sequence": "① The sequence",
    "trp_cage": "Trp-cage (TC5b, PDB 1L2Y), a {m}-residue miniprotein that folds on its own, the default example:",
    "sequence": "The sequence given ({m} residues):",
    "s_steps": "② From attention to contacts",
    "steps": "The model reads <cls>, the residues, <eos>: n = {n} tokens. Every layer's attention is kept: {L} layers "
             "× {H} heads = {LH} maps of {n} × {n}. <cls> and <eos> are dropped ({m} × {m}); each map is "
             "symmetrised (A + Aᵀ: a contact has no direction) and average-product corrected, F = X − "
             "(row sums)(column sums)/total, which removes what a residue's overall pull explains (APC, from "
             "coevolution methods). Then P[i, j] = σ(Σ_c w_c·F_c[i, j] + b) over the {LH} heads; the largest "
             "weights: {named}; b = {b:+.3f}.",
    "checked": "Recomputed here head by head: every F equals the engine's within {diff_features:.1e}, the map P "
               "within {diff_map:.1e} (the same steps as transformers' EsmModel.predict_contacts); every F sums to "
               "0 ({diff_total:.1e}), as APC makes it.",
    "s_map": "③ The contact map, beside the best head",
    "map": "P, shaded from its lowest ({lo:.3f}) to its highest ({hi:.3f}) off the diagonal ({shades}); right: the "
           "map of the single head that matches it best.",
    "map_title": "P (the contact head)",
    "best_title": "head {layer}.{head} (r = {r:+.3f})",
    "top": "The pairs the model is surest of, at least {separation} apart in the chain:",
    "col_pair": "pair",
    "col_residues": "residues",
    "col_p": "P",
    "s_heads": "④ The heads that draw contacts",
    "heads": "Each head's F against P, by Pearson's r over the pairs at least {separation} apart (the best one's r "
             "checked with np.corrcoef: {diff_r:.1e}):",
    "col_head": "head",
    "col_r": "r",
    "col_w": "weight w",
    "noise": "On a random or untrained model the map is noise; the computation is exactly the one ESM-2 runs.",
    "end": "No structure was given: the contacts come from attention alone, learnt from sequences.",
    "fig_map": "predicted contacts P",
    "fig_head": "head {layer}.{head}: APC(A + Aᵀ), r = {r:+.2f}",
    "fig_title": "{model}: contacts from attention ({m} residues)",
}


PAGES = {"explain": EXPLAIN, "pipeline": PIPELINE, "ffn": FFN, "flash": FLASH, "gqa": GQA, "kvcache": KVCACHE,
         "positions": POSITIONS, "sparse": SPARSE, "vit": VIT, "graph": GRAPH, "circuits": CIRCUITS,
         "patching": PATCHING, "viewer": VIEWER, "linear": LINEAR, "proteins": PROTEINS}
