"""The pipeline page's words, in English and Korean: `qkv explain`'s own sentences where they fit.

The keys of SHARED_KEYS are taken from `qkv.viz.explain_text` (the walkthrough's sentences), so the page
and `qkv explain` say the same thing in the same words; the "p_" keys are the page's own. Each entry
is a `str.format`-style template that pipeline.js fills in ({name}, {name:.3f}).
"""

from __future__ import annotations

import re

from . import explain_text

SHARED_KEYS = ("s_tokens", "tokens", "tokens_bpe", "x_embed_rope", "s_qkv", "s_gqa", "s_s", "s_scale", "mask",
               "s_softmax", "looks_most", "s_z", "z_seed", "s_out", "library", "first_values", "col_key")

STEP = re.compile(r"^[⓪①-⑳][a-z]? ")       # the walkthrough's step numbers: the page numbers its own boxes


def _page(text: str) -> str:
    """A walkthrough sentence as the page says it: without the step number it opens with."""
    return STEP.sub("", text)


EN = {key: _page(explain_text.EN[key]) for key in SHARED_KEYS}
KO = {key: _page(explain_text.KO[key]) for key in SHARED_KEYS}

# the page's own words: the boxes of the whole model, from tokens to the next token
EN.update({
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
    "p_mask_window_f": "S' = S + M,  M[i, j] = −∞ unless i − {w} < j ≤ i   (layer {layer} sees the last {w} keys)",
    "p_out_norm": "Then normalised before it joins the stream: out = Norm(Concat(Z)·W_O).",
    "p_res_parallel_f": "X'' = X + Attention(Norm(X)) + FFN(Norm(X))   (parallel: the FFN reads X, not X')",
    "p_router": "Router: which experts", "p_router_f": "p = softmax(x·W_router) over {E} experts; the top {k} run: "
                                                     "FFN(x) = Σ_e w_e·FFN_e(x)",
    "p_router_shared": "+ σ(x·w_gate)·FFN_shared(x): a shared expert every token runs.",
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
})

KO.update({
    "p_title": "qkv 파이프라인 · {model}",
    "p_intro": "모델을 데이터 흐름으로 그렸고, 상자마다 이 텍스트의 실제 숫자가 들어 있습니다. 상자를 눌러 "
               "열어 보세요. 위에서 토큰, 층, 헤드를 고릅니다.",
    "p_token": "토큰", "p_layer": "층", "p_head": "헤드", "p_lang": "English",
    "p_qknorm": "q/k 정규화", "p_qknorm_head_f": "q = Norm(q),  k = Norm(k)   헤드마다 d_k개 숫자에 대해, RoPE 전에",
    "p_qknorm_all_f": "q = Norm(q),  k = Norm(k)   투영 전체(H·d_k개 숫자)에 대해, 헤드로 나누기 전에",
    "p_qknorm_what": "q와 k가 길어진다고 점수가 커지지 않습니다. 보이는 q, k는 정규화(와 RoPE) 뒤의 값입니다.",
    "p_rope_none": "{layer}번 층에는 RoPE가 없습니다: Q와 K에 위치가 담기지 않습니다.",
    "p_rope_local": "{layer}번 층은 슬라이딩 층입니다: RoPE 밑(base)이 {theta}입니다(다른 층은 {base}).",
    "p_alibi": "ALiBi: 거리만큼의 편향",
    "p_alibi_f": "S[i, j] = S[i, j] + m_h·j   ({head}번 헤드의 m_h = {slope})",
    "p_alibi_what": "위치 벡터가 전혀 없습니다: 헤드마다 제 기울기에 키의 위치를 곱해 더합니다. 소프트맥스는 행마다 "
                    "상수를 무시하므로 이는 −m_h·(i − j)와 같습니다: 키가 멀수록 점수가 낮아집니다.",
    "p_softcap": "소프트캡", "p_softcap_f": "S = c·tanh(S / c),   c = {c}",
    "p_softcap_what": "점수가 ±c 안에 머뭅니다: 큰 점수는 눌리고, 작은 점수는 거의 그대로 지나갑니다.",
    "p_s_scaled_f": "S = Q·Kᵀ · {scale}   (1/√d_k 대신 이 모델의 배율)",
    "p_mask_window_f": "S' = S + M,  i − {w} < j ≤ i가 아니면 M[i, j] = −∞   ({layer}번 층은 마지막 키 {w}개를 봅니다)",
    "p_out_norm": "그다음 스트림에 더하기 전에 정규화합니다: out = Norm(Concat(Z)·W_O).",
    "p_res_parallel_f": "X'' = X + Attention(Norm(X)) + FFN(Norm(X))   (병렬: FFN은 X'가 아니라 X를 읽습니다)",
    "p_router": "라우터: 어느 전문가로", "p_router_f": "p = softmax(x·W_router), 전문가 {E}개 중 상위 {k}개 실행: "
                                                 "FFN(x) = Σ_e w_e·FFN_e(x)",
    "p_router_shared": "+ σ(x·w_gate)·FFN_shared(x): 모든 토큰이 거치는 공유 전문가.",
    "p_router_dense": "{layer}번 층은 밀집 층입니다: 모든 토큰이 FFN 하나를 거치고, 라우터가 없습니다.",
    "p_router_token": "“{token}”이(가) 간 곳:", "p_expert": "전문가", "p_weight": "가중치",
    "p_final_softcap": "logits = c·tanh(logits / c),   c = {c}",
    "p_logit_scale": "logits × {s}   (이 모델의 로짓 배율)",
    "p_embed_mult": "X = E[ids] × {m}",
    "p_embed": "임베딩 (+ 위치)",
    "p_embed_f": "X = E[ids] + P[positions]   (n × d_model)",
    "p_block": "{L}개 중 {layer}번 블록",
    "p_blocks": "블록 {L}개, 각각: {what}",
    "p_norm": "정규화", "p_norm2": "정규화 (FFN 앞)",
    "p_norm_rms_f": "RMSNorm(x) = x / √(mean(x²) + ε) · g",
    "p_norm_layer_f": "LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · g + b",
    "p_qkv_f": "Q = X·W_Q,  K = X·W_K,  V = X·W_V",
    "p_s_f": "S = Q·Kᵀ / √d_k",
    "p_mask": "마스크 M", "p_mask_f": "S' = S + M,  M[i, j] = −∞ (j > i), 0 (j ≤ i)",
    "p_mask_none": "마스크 없음: {model}은(는) 인코더라서 모든 토큰이 모든 토큰을 봅니다(M = 0).",
    "p_a_f": "A = softmax(S + M), 각 행의 합 = 1",
    "p_z_f": "Z = A·V",
    "p_out_f": "Concat(Z_0 … Z_{last})·W_O",
    "p_res": "+ 잔차 연결", "p_res2": "+ 잔차 연결 (FFN 뒤)",
    "p_res_pre_f": "X' = X + Attention(Norm(X))", "p_res_post_f": "X' = Norm(X + Attention(X))",
    "p_res2_pre_f": "X'' = X' + FFN(Norm(X'))", "p_res2_post_f": "X'' = Norm(X' + FFN(X'))",
    "p_ffn": "FFN(피드포워드)", "p_ffn_f": "FFN(x) = act(x·W_in + b)·W_out + b   (d_ff = {d_ff})",
    "p_ffn_gated_f": "FFN(x) = (act(x·W_gate) ⊙ x·W_in)·W_out   (d_ff = {d_ff})",
    "p_final": "마지막 정규화", "p_final_f": "H = Norm({last}번 블록 뒤의 X)",
    "p_logits": "로짓", "p_logits_f": "logits = H · W_vocab   (n × d_model)·(d_model × V) = n × V",
    "p_logits_what": "어휘집 항목마다 점수 하나(V = {V}). 이 페이지는 다음 토큰을 예측하는 마지막 위치의 "
                     "로짓을 담습니다.",
    "p_probs": "softmax(logits / T) → 다음 토큰",
    "p_probs_f": "P(다음 토큰) = softmax(logits[마지막] / T), 그다음 top-k, top-p",
    "p_temp": "온도 T", "p_topk": "top-k", "p_topp": "top-p", "p_off": "끔",
    "p_greedy": "T = 0: 탐욕적 선택, 모든 확률이 가장 높은 토큰에.",
    "p_remain": "토큰 {V}개 중 {k}개가 남습니다.",
    "p_next": "다음 토큰", "p_prob": "확률", "p_removed": "필터로 제외됨",
    "p_bar_scale": "막대의 길이가 곧 확률입니다 (전체 폭 = 100%).",
    "p_hidden": "마지막 은닉 상태", "p_pooled": "풀링된 임베딩",
    "p_encoder_end": "{model}은(는) 인코더입니다: W_vocab도, 로짓도, 다음 토큰도 없습니다. 출력은 토큰마다 "
                     "벡터 하나인 마지막 은닉 상태이고, 문장 임베딩은 그 평균(평균 풀링)을 길이로 나눈 것입니다.",
    "p_pooled_f": "e = mean_i(H_i) / |mean_i(H_i)|",
    "p_rope": "RoPE: 위치만큼 회전하는 Q와 K",
    "p_stream": "잔차 스트림", "p_stream_what": "각 블록으로 들어가는 토큰별 잔차 스트림의 길이 |x| "
                "(행: 0…{L}번 블록, 마지막 행은 마지막 블록 뒤). 진할수록 깁니다(로그 눈금).",
    "p_embed_rope": "X는 토큰 임베딩뿐입니다: 위치 벡터를 더하지 않습니다. 이 모델은 위치를 나중에, Q와 K를 "
                    "회전시켜 넣습니다(RoPE 상자).",
    "p_rope_f": "q' = R(p)·q,  k' = R(p)·k:  숫자 쌍 (x_2i, x_2i+1)마다 각도 p·θ_i만큼 회전,  θ_i = base^(−2i/d)",
    "p_rope_what": "회전은 벡터의 길이를 바꾸지 않습니다: |q'| = |q|. 바뀌는 것은 쿼리와 키 사이의 각도라서, 점수가 "
                   "두 토큰의 거리에 따라 달라집니다. 보이는 숫자는 회전 뒤, 어텐션이 읽는 값입니다.",
    "p_rope_partial": "헤드마다 숫자 {d_k}개 중 앞 {r}개만 회전합니다; 나머지는 그대로 지나갑니다.",
    "p_rope_pairs": "쌍은 이웃한 숫자입니다: (x_0, x_1), (x_2, x_3), … (GPT-J의 교차 배치).",
    "p_gqa_what": "K/V 헤드는 한 번 계산되어 쿼리 헤드 G = {G}개가 읽습니다: KV 캐시에는 헤드 {H}개가 아니라 "
                  "{H_kv}개가 담깁니다.",
    "p_gqa": "쿼리 헤드 {head}번은 K/V 헤드 {kv}번을 읽습니다: K/V 헤드 하나를 쿼리 헤드 G = {G}개가 공유합니다"
             "(쿼리 헤드 {H}개, K/V 헤드 {H_kv}개).",
    "p_shape": "shape", "p_first": "앞 {k}개 값", "p_length": "길이 |x|",
    "p_row": "“{token}”의 행", "p_masked": "가려짐 (−∞)",
    "p_a_quant": "가중치는 1바이트씩 전달됩니다(±0.002).",
    "p_s_quant": "점수는 1바이트씩 전달됩니다(여기서는 ±{step}).",
    "p_stack": "스택",
    "p_memory_box": "인코더 출력 M",
    "p_memory": "인코더의 출력 M: 원문 토큰마다 벡터 하나. 디코더의 모든 층이 교차 어텐션으로 이를 읽습니다"
                "(K = M·W_K, V = M·W_V). 디코더로 바꿔 따라가 보세요.",
    "p_mask_enc": "마스크 없음: 인코더는 원문을 양방향으로 읽어 모든 토큰이 모든 토큰을 봅니다(M = 0).",
    "p_xnorm": "정규화 (교차 어텐션 앞)",
    "p_xqkv": "교차 어텐션: Q는 디코더에서, K와 V는 인코더에서",
    "p_xqkv_f": "Q = Y·W_Q (디코더),  K = M·W_K,  V = M·W_V (인코더 출력 M)",
    "p_xattn": "교차 어텐션: A = softmax(Q·Kᵀ / √d_k)",
    "p_xattn_what": "i번 행: 번역 토큰 i가 원문의 어느 토큰을 읽는지 (n_tgt × n_src = {n} × {m}).",
    "p_xz": "Z = A·V (교차 어텐션)", "p_xout": "Concat(Z)·W_O (교차 어텐션)",
    "p_xres": "+ 잔차 연결 (교차 어텐션 뒤)",
    "p_xres_pre_f": "X'' = X' + CrossAttention(Norm(X'), M)", "p_xres_post_f": "X'' = Norm(X' + CrossAttention(X', M))",
    "p_reads": "가장 많이 읽는 원문 토큰 “{token}”의 k, v",
    "p_encoder": "인코더", "p_decoder": "디코더",
    "p_ar_title": "칸 하나씩, 그 계산",
    "p_ar_hint": "헤드 {head} (K/V 헤드 {kv}번을 읽음). S, A, Z의 칸에 마우스를 올리거나, 칸에 초점을 두고 화살표 "
                 "키로 움직이세요: 엔진의 q, k, v로 그 칸의 계산이 아래에 나옵니다.",
    "p_ar_aria": "{matrix}: 칸에 마우스를 올리거나 화살표 키로 그 계산을 봅니다",
    "p_ar_missing": "이 페이지에는 층 {layers}의 q, k, v 전체만 들어 있습니다(계산에는 숫자가 모두 필요합니다). "
                    "그중 한 층을 고르거나, 층 {layer}의 페이지를 만드세요: qkv show TEXT --layer {layer} --out DIR.",
    "p_ar_S": "S[{i}, {j}]: 쿼리 {i} {q}와 키 {j} {k}: 곱 q_i[d]·k_j[d] {d}개를 더하고 × {scale}",
    "p_ar_cap": "소프트캡 {c}·tanh(S/{c})",
    "p_ar_alibi": "+ ALiBi 편향 m_h·(키의 위치)",
    "p_ar_bias": "+ 학습된 위치 편향",
    "p_ar_masked": "쿼리 {i}에게 키 {j}는 가려져 있습니다(M = −∞): 가중치는 0이 됩니다.",
    "p_ar_A": "A[{i}, {j}]: {i}번 행 {q}의 softmax 중 키 {j} {k}: 모든 키의 exp(S − max), 그 합, 그리고 하나를 "
              "합으로 나눈 값",
    "p_ar_max": "행의 최댓값 = {max}",
    "p_ar_Z": "Z[{i}, {c}]: 쿼리 {i} {q}의 {c}번 성분: 값 v_j[{c}]마다 가중치 A[{i}, j]를 곱해 키 {m}개에 걸쳐 더한 것",
    "p_ar_engine": "엔진",
    "p_ar_rest": "나머지 항 {k}개",
    "p_ar_replay": "다시 보기",
    "p_ar_load": "층 {layer}의 계산 불러오기",
})

TEXTS = {"en": EN, "ko": KO}
