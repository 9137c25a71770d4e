"""Every sentence qkv's pages and lessons show, in Korean: `en.py`'s tables with the same keys and the same
fields (tests/test_words.py checks it), said in Korean. `viz.words.texts(page)` gives a page's tables by language.
"""

from __future__ import annotations

# `qkv explain` (lessons.attention, lessons.attention_render): the walkthrough of one head; the pipeline
# page says some of them too (`viz.pipeline_text.SHARED_KEYS`)
EXPLAIN = {
    "title": "qkv explain · {model} · {layer}번 층 · {H}개 헤드 중 {head}번 헤드",
    "formula": "Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k) · V 를 실제 모델의 헤드 하나로 한 단계씩 계산합니다. "
               "d_model = {d_model}, 헤드 H = {H}개, d_k = d_model / H = {d_k}.",
    "library": "도서관 비유: 쿼리는 내가 찾는 검색어, 키는 각 책의 색인표, 밸류는 책의 실제 내용입니다. "
               "쿼리와 잘 맞는 키일수록 그 밸류를 더 많이 가져옵니다.",

    "s_tokens": "⓪ 토큰 → ID",
    "tokens": "토크나이저가 텍스트를 n = {n}개의 토큰으로 자르고, 각 ID로 임베딩 테이블의 행을 조회합니다.",
    "col_token": "토큰", "col_spelled": "표기", "col_id": "ID",
    "tokens_bpe": "토큰은 공백이 보이도록 표시합니다(␣ 공백, ↵ 줄바꿈). 바이트 수준 BPE는 바이트마다 "
                  "한 글자로 씁니다(공백은 Ġ, 줄바꿈은 Ċ).",

    "s_x": "① X: {layer}번 층의 입력",
    "x": "X는 {layer}번 층으로 들어가는 잔차 스트림으로, 토큰마다 d_model개의 숫자가 한 행을 이룹니다. shape {shape}.",
    "x_embed": "0번 층에서 X는 임베딩입니다: 토큰 + 위치{types} 벡터{embed_norm}.",
    "x_types": " + 세그먼트", "x_embed_norm": ", 그다음 LayerNorm",
    "x_embed_rope": "0번 층에서 X는 토큰 임베딩뿐입니다: 위치 벡터를 더하지 않습니다. 이 모델은 위치를 나중에, "
                    "Q와 K를 회전시켜 넣습니다(RoPE, ②a단계).",
    "x_post": "{model}은(는) post-norm(BERT)입니다: 어텐션은 X를 그대로 읽고, LayerNorm은 잔차 연결 뒤에 옵니다: "
              "X' = Norm(X + Attention(X)).",
    "x_pre": "{model}은(는) pre-norm입니다: 어텐션은 Norm(X)를 읽고, X는 잔차 연결로 그대로 흘러갑니다: "
             "X' = X + Attention(Norm(X)).",
    "first_values": "앞 {k}개 값",

    "s_norm": "①a {name}: 어텐션이 읽는 입력",
    "norm_rms": "어텐션은 X가 아니라 Norm(X)를 읽습니다. RMSNorm(x) = x / √(mean(x²) + ε) · g, ε = {eps:g}, "
                "학습된 게인 g {gs}: 각 행의 제곱평균제곱근을 1로 맞춥니다(LayerNorm과 달리 평균을 빼지 않고 "
                "바이어스도 없습니다). “{token}”의 경우: √(mean(x²) + ε) = {scale:.4f}.",
    "norm_layer": "어텐션은 X가 아니라 Norm(X)를 읽습니다. LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · g + b, "
                  "ε = {eps:g}, 학습된 g, b {gs}. “{token}”의 경우: mean(x) = {mean:.4f}, "
                  "√(var(x) + ε) = {scale:.4f}.",
    "norm_check": "엔진의 {name} 결과와 같습니다(최대 차이 {diff:.1e}).",

    "s_qkv": "② Q, K, V: 같은 X를 세 방향으로 선형 변환",
    "w_q": "W_Q는 {W}(d_model × H·d_k)이고, {head}번 헤드는 그중 {lo}..{hi}번 열을 씁니다: W_Q^{head}는 {Wh}.",
    "qkv": "Q = {x_name}·W_Q^{head}{b}   {xs} · {ws} = {qs}.   K와 V도 W_K, W_V로 같은 방식입니다: "
           "K {ks}, V {vs}.",
    "qkv_check": "모델이 계산한 q, k, v와 같습니다(최대 차이 {diff:.1e}).",
    "qkv_check_rope": "Q와 K는 RoPE 회전 전의 값입니다(②a단계에서 회전). V는 모델이 계산한 v와 같습니다"
                      "(최대 차이 {diff:.1e}).",

    "s_rope": "②a RoPE: 위치만큼 회전하는 Q와 K",
    "rope_what": "어텐션만으로는 순서를 모릅니다. RoPE(가이드: 위치)는 각 쿼리와 키를 위치 p에 비례하는 각도로 회전시킵니다: "
                 "d_k = {d_k}개의 숫자가 {pairs}개의 쌍 (i, i + {pairs})을 이루고, 쌍 i는 p·ω_i만큼 돕니다. "
                 "ω_i = θ^(−2i/d_k), θ = {theta:g}. 0번 쌍은 토큰마다 {w0:.3f} rad, {last}번 쌍은 {wl:.1e} rad만 "
                 "돕니다: 빠른 쌍은 가까운 위치를, 느린 쌍은 먼 위치를 구별합니다.",
    "rope_pair": "위치 {p}에 있는 “{token}”의 쿼리, 회전 전과 후: 0번 쌍은 {a0:.3f} rad, 마지막 쌍은 {al:.1e} rad "
                 "회전합니다. 회전은 길이 |q|를 바꾸지 않습니다.",
    "col_pair": "쌍 ({a}, {b})", "before": "RoPE 전", "after": "RoPE 후",
    "rope_check": "θ로 다시 계산한 RoPE가 모델이 쓴 q, k와 같습니다(최대 차이 {diff:.1e}).",
    "rope_relative": "왜 회전인가: RoPE 뒤의 q·k는 두 토큰이 어디 있는지가 아니라 얼마나 떨어져 있는지(m − n)에만 "
                     "달려 있습니다. “{q}”의 쿼리와 “{k}”의 키를 함께 다른 위치로 옮기면:",
    "col_qpos": "q의 위치 m", "col_kpos": "k의 위치 n",
    "rope_relative_end": "거리가 같으면 점수도 같습니다(최대 차이 {spread:.1e}). 첫 행은 ③단계의 S[{q}, {k}]입니다. "
                         "거리가 다르면 점수도 달라집니다.",

    "s_gqa": "②b GQA: 쿼리 헤드 {H}개가 K/V 헤드 {H_kv}개를 공유",
    "gqa_what": "W_Q는 {wq}이지만 W_K와 W_V는 {wk}입니다: 토큰마다 쿼리는 {H}개, 키는 {H_kv}개, 밸류도 "
                "{H_kv}개만 계산합니다. Q {qs}, K {ks}, V {ks}. K/V 헤드 하나가 쿼리 헤드 G = {G}개를 맡습니다: "
                "쿼리 헤드 h는 K/V 헤드 ⌊h / G⌋를 읽습니다.",
    "col_kv_head": "K/V 헤드", "col_query_heads": "이를 읽는 쿼리 헤드",
    "gqa_follow": "{head}번 헤드는 {others}번 헤드와 함께 {kv}번 K/V 헤드를 읽습니다. KV 캐시는 토큰마다 K와 V를 "
                  "{H}개 대신 {H_kv}개 헤드만 저장합니다: 메모리 {G}분의 1.",
    "gqa_check": "{heads}번 헤드의 점수를 공유된 K 하나로 다시 계산하면 모델의 점수와 같습니다(최대 차이 {diff:.1e}).",
    "row_of": "“{token}”의 행",

    "s_s": "③ Q·Kᵀ: 모든 쿼리와 모든 키의 내적",
    "s": "{qs} · {kts} = {ss}. (Q·Kᵀ)[i, j]는 토큰 i의 쿼리와 토큰 j의 키의 내적, 즉 두 벡터가 얼마나 같은 방향을 "
         "가리키는지입니다. {corner}:",

    "s_scale": "④ 스케일링: 점수 행렬 S = Q·Kᵀ / √d_k",
    "scale": "√d_k = √{d_k} = {sqrt:.3f}. 이렇게 나누면 점수가 소프트맥스가 가중치를 고르게 나눌 수 있는 범위에 "
             "머뭅니다(이유는 ⑧단계). shape {ss}. {corner}:",
    "corner": "왼쪽 위 모서리", "whole": "전체",
    "mask": "인과 마스킹(가이드: 마스크): 대각선 위, 즉 키 j가 쿼리 i보다 뒤에 있으면 M[i, j] = −∞ 이고, 소프트맥스가 그 "
            "자리를 0으로 만듭니다: 어떤 토큰도 미래를 보지 못합니다. 점수 {total}개 중 {masked}개가 가려지며 −∞로 "
            "표시합니다.",
    "alibi": "ALiBi(BLOOM, Falcon): 위치 임베딩 대신 S에 m·p_j를 더합니다. 이 헤드의 기울기 m = {slope:.4g}(Falcon은 "
             "점수처럼 √d_k로 나눔)에 키 j의 위치를 곱한 값이라, 쿼리에서 멀리 떨어진 키일수록 점수가 낮아지고 "
             "헤드마다 기울기가 다릅니다.",
    "scale_check": "모델이 계산한 점수와 같습니다(최대 차이 {diff:.1e}).",

    "s_softmax": "⑤ 소프트맥스: A = softmax(S + M), 행마다",
    "softmax": "각 행이 0과 1 사이의 가중치로 바뀌고 합은 1입니다(행 합의 최대 오차 {dev:.1e}). shape {ss}. "
               "“{token}”의 행:",
    "looks_most": "“{token}”은(는) “{target}”(토큰 {j})을(를) 가장 많이 봅니다. 가중치 {w:.3f}.",
    "col_key": "키",

    "s_z": "⑥ Z = A·V: 밸류의 가중합",
    "z": "{as_} · {vs} = {zs}. 각 토큰의 출력은 모든 토큰의 밸류를 가중치만큼 섞은 것입니다. “{token}”의 경우:",
    "z_seed": "(가이드의 토큰 3개 예시처럼: Z1 = 0.7·v1 + 0.2·v2 + 0.1·v3)",
    "z_check": "모델이 계산한 헤드 출력과 같습니다(최대 차이 {diff:.1e}).",

    "s_out": "⑦ Concat(Z_0 … Z_{last}) · W_O: 헤드를 하나로",
    "out": "{H}개 헤드의 출력을 이어 붙이면(Concat) {cs}가 되고, W_O {ws}가 이를 다시 d_model 차원으로 압축합니다: "
           "{cs} · {ws}{b} = {os}.",
    "out_check": "모델이 계산한 어텐션 출력과 같습니다(최대 차이 {diff:.1e}).",
    "out_post": "블록은 이 값을 X에 더한 뒤 정규화합니다: Norm(X + Attention(X)). 그다음 FFN이 이어집니다.",
    "out_pre": "블록은 이 값을 X에 더합니다(잔차 연결). 그다음 FFN이 이어집니다.",

    "s_why": "⑧ 왜 √d_k로 나누나",
    "why_var": "분산이 1인 독립 성분 d_k개로 된 두 랜덤 벡터의 내적은 분산이 d_k입니다(전형적인 크기는 √d_k에 "
               "비례해 커집니다). 랜덤 벡터 쌍 {N}개로 측정(seed 0):",
    "col_dk": "d_k", "col_var": "var(q·k)", "col_std": "std(q·k)", "col_var_scaled": "var(q·k / √d_k)",
    "why_var_end": "d_k = 64이면 점수가 약 8배 커집니다(√64 = 8). √d_k로 나누면 어느 크기에서든 분산이 약 1이 됩니다.",
    "why_softmax": "점수가 크면 소프트맥스가 포화됩니다: 가중치가 거의 한 키에 몰리고, 기울기 p·(1 − p)가 0에 "
                   "가까워져 나머지 단어로부터 학습이 멈춥니다.",
    "why_softmax_end": "softmax([100, 1, 1])에서는 나머지 키의 가중치가 약 10⁻⁴³입니다. 10배 줄이면 약 10⁻⁴가 되어 "
                       "기울기가 다시 살아나고, 100배 줄이면 실제로 몫을 나눠 갖습니다.",
    "col_scores": "점수", "col_softmax": "소프트맥스", "col_grad": "가장 큰 p·(1 − p)",
    "why_model": "실제 모델에서 같은 행을 1/√d_k 스케일링 없이 계산하면 "
                 "(엔트로피, 단위 nat: 0 = 한 키에 전부, log n = {logn:.2f} = 고르게 분포):",
    "col_what": "", "col_scaled": "/√d_k 적용", "col_unscaled": "미적용",
    "this_head": "{head}번 헤드: 행 엔트로피 평균", "this_head_max": "{head}번 헤드: 가장 큰 가중치 평균",
    "all_heads": "{layer}번 층의 {H}개 헤드 전체: 엔트로피 평균", "all_heads_max":
        "{layer}번 층의 {H}개 헤드 전체: 가장 큰 가중치 평균",
    "why_end": "스케일링이 없으면 행이 더 날카로워집니다: 모델이 한 번에 더 적은 토큰만 보게 됩니다.",
}

# the pipeline page's own words (pipeline.js, pipeline_diagram.js; `viz.pipeline_text` adds EXPLAIN's where
# they fit): the boxes of the whole model, from tokens to the next token
PIPELINE = {
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
    "p_mask_chunk_f": "S' = S + M,  j ≤ i이고 ⌊j / {c}⌋ = ⌊i / {c}⌋가 아니면 M[i, j] = −∞   ({layer}번 층은 위치 {c}개짜리 자기 청크만 봅니다)",
    "p_mask_window_f": "S' = S + M,  i − {w} < j ≤ i가 아니면 M[i, j] = −∞   ({layer}번 층은 마지막 키 {w}개를 봅니다)",
    "p_out_norm": "그다음 스트림에 더하기 전에 정규화합니다: out = Norm(Concat(Z)·W_O).",
    "p_res_parallel_f": "X'' = X + Attention(Norm(X)) + FFN(Norm(X))   (병렬: FFN은 X'가 아니라 X를 읽습니다)",
    "p_router": "라우터: 어느 전문가로", "p_router_f": "p = softmax(x·W_router), 전문가 {E}개 중 상위 {k}개 실행: "
                                                 "FFN(x) = Σ_e w_e·FFN_e(x)",
    "p_router_shared": "+ σ(x·w_gate)·FFN_shared(x): 모든 토큰이 거치는 공유 전문가.",
    "p_router_f_sigmoid": "s = σ(x·W_router), 전문가 {E}개 각각의 점수; 상위 {k}개 실행: FFN(x) = Σ_e w_e·FFN_e(x)",
    "p_router_shared_plain": "+ FFN_shared(x): 모든 토큰이 게이트 없이 거치는 공유 전문가.",
    "p_router_bias": "선택은 s + b로 순위를 매깁니다: 전문가마다 하나인 b는 전문가를 고르기만 하고 가중치에는 들어가지 않습니다.",
    "p_router_groups": "전문가 그룹 {G}개 중 상위 {kept}개 그룹의 전문가만 고를 수 있습니다 (그룹의 순위: 가장 높은 두 점수의 합).",
    "p_router_scale": "가중치 w에 {c}를 곱합니다.",
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
    "p_rope_latent": "멀티헤드 잠재 어텐션(DeepSeek): 헤드마다 숫자 {d_k}개 중 마지막 {r}개만 회전하고, k의 {r}개는 모든 "
                     "헤드가 함께 쓰는 키 하나입니다. 헤드마다의 K와 V(V는 {d_v}개)는 토큰마다 숫자 {r_kv}개의 잠재 "
                     "벡터에서 나오며, KV 캐시는 그것만 담습니다(`qkv explain kv-cache`).",
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
    # softmax가 없는 층(선택적 스캔, 선형 어텐션): 그 층의 단계들 (viz/pipeline_mixer.py)
    "p_mix_x": "입력 투영과 합성곱: x̃", "p_mix_qkv": "q, k, v", "p_mix_bc": "B와 C",
    "p_mix_dt_scan": "Δ, 스텝", "p_mix_dt_delta": "β와 감쇠 g", "p_mix_dt_lightning": "감쇠 λ",
    "p_mix_matrix": "숨은 행렬", "p_mix_out": "행렬 × 값",
    "p_mix_mamba": "층 {layer}은 Mamba 층입니다: 선택적 스캔이며 q, k, v도 softmax도 없습니다. 펼쳐 보면 채널마다 "
                   "하삼각 행렬 하나로 토큰들을 섞습니다(Ali 외 2024).",
    "p_mix_mamba2": "층 {layer}은 Mamba-2 층입니다: 감쇠가 헤드마다 숫자 하나인 선택적 스캔이라, 헤드마다 하삼각 "
                    "행렬 하나로 토큰들을 섞습니다(SSD, Dao & Gu 2024).",
    "p_mix_parallel": "층 {layer}은 같은 Norm(X)에서 어텐션과 Mamba-2 믹서를 나란히 돌립니다(Falcon-H1): 믹서의 "
                      "단계가 어텐션의 단계 뒤에 오고, 두 출력을 더합니다.",
    "p_mix_delta": "층 {layer}은 게이트 델타 층입니다(Qwen3-Next의 선형 어텐션): 값 헤드마다 d_k × d_v 상태가 있고 "
                   "softmax는 없습니다. 상태가 값에 선형이므로 토큰들 위의 행렬 하나가 됩니다.",
    "p_mix_lightning": "층 {layer}은 라이트닝 어텐션입니다(MiniMax): 헤드마다 감쇠가 있는 선형 어텐션으로, softmax도 "
                       "RoPE도 1/√d_k도 없습니다.",
    "p_mix_x_mamba_f": "[u | z] = h·W_in,   x̃ = act(conv_{k}(u))   (B, n, E = {E})",
    "p_mix_x_mamba2_f": "[z | u | δ] = h·W_in,   [x̃ | B | C] = act(conv_{k}(u))   x̃: (B, n, H = {H}, P = {P})",
    "p_mix_qkv_delta_f": "[q | k | v] = act(conv_{k}(h·[W_q | W_k | W_v])),   q̂ = q/‖q‖·d_k^−½,   k̂ = k/‖k‖",
    "p_mix_qkv_lightning_f": "[q | k | v] = act(h·W_QKV)   (RoPE도 1/√d_k도 없음)",
    "p_mix_dt_mamba_f": "Δ = softplus(δ·W_dt + b_dt),   상태는 exp(Δₜ·A[c, n])만큼 줄어듭니다,  A = −exp(A_log)",
    "p_mix_dt_mamba2_f": "Δ = softplus(δ + b_dt),   상태는 exp(Δₜ·A_h)만큼 줄어듭니다,  A_h = −exp(A_log)",
    "p_mix_dt_delta_f": "β = σ(h·W_b),   g = −exp(A_log)·softplus(h·W_a + b_dt),   상태는 exp(g)만큼 줄어듭니다",
    "p_mix_dt_lightning_f": "λ_h = exp(−r_h): 한 걸음 뒤로 갈 때마다 키의 몫에 λ를 곱합니다(모든 토큰에서 같음)",
    "p_mix_bc_f": "B: 각 토큰이 상태에 쓰는 것;  C: 그것을 다시 읽는 것  (스캔의 k와 q, N = {N})",
    "p_mix_matrix_scan_f": "α[t, s] = Cₜ·(Π_(r = s+1..t) exp(Δᵣ·A))·Bₛ·Δₛ    (s > t이면 0)",
    "p_mix_matrix_delta_f": "A[t, s] = βₛ·q̂ₜᵀ·(Π_(r = s+1..t) exp(g_r)·(I − β_r·k̂_r·k̂_rᵀ))·k̂ₛ    (s > t이면 0)",
    "p_mix_matrix_lightning_f": "A[t, s] = (qₜ·kₛ)·λ^(t − s)    (s > t이면 0)",
    "p_mix_matrix_what": "softmax가 없습니다: 값이 음수일 수 있고 행의 합이 1일 필요도 없습니다. 모든 어텐션 보기, "
                         "rollout, 수업은 |·|를 읽고 각 행을 그 합으로 나눕니다. 보이는 것: {what}.",
    "p_mix_out_scan_f": "y = α·x̃  (+ D ⊙ x̃, 따로 둔 건너뛰기),   그다음 게이트 SiLU(z), (정규화)와 W_out",
    "p_mix_out_linear_f": "o = A·v,   그다음 정규화, 게이트, 출력 투영",
    "p_mix_sum": "Σₛ M[{t}, s]·v_s[{c}] = {sum}   엔진의 출력: {engine}",
    "p_mix_skip": "D = {d}: 행렬 다음에 y + D·x̃를 더합니다",
    "p_mix_whole": "층 {layer}의 행렬 전체는 이 페이지에 없습니다(너무 큼): 합은 페이지를 연 층에 가까운 층들에서 "
                   "보입니다.",
    "p_mix_outproj": "출력 투영: d_model로 돌아가기",
    "p_mix_what_mamba": "채널 {i}", "p_mix_what_mamba2": "Mamba 헤드 {i}", "p_mix_what_delta": "값 헤드 {i}",
    "p_mix_what_lightning": "헤드 {i}",
    "p_mix_pick": "행렬", "p_mix_decay": "로그 감쇠",
    "p_out_beside_f": "Attention(h·{a_in})·{a_out} + Mixer(h)·{ssm}   (h = Norm(X): 두 상자가 함께 읽음)",
    "p_res_minimax_f": "X' = {alpha}·Norm(X) + {beta}·Attention(Norm(X))   (정규화된 흐름이 이어짐)",
    "p_res2_minimax_f": "X'' = {alpha}·Norm(X') + {beta}·FFN(Norm(X'))",
    "p_res_mixer_f": "X' = X + Mixer(Norm(X))   (어텐션 자리에 믹서)",
    "p_z_gated": "이 층은 헤드마다 게이트를 둡니다: W_O가 읽고 여기 보이는 것은 Z_h ⊙ σ(X·W_G)_h입니다.",
}

# qkv explain ffn (lessons.ffn, lessons.ffn_figures)
FFN = {
    "title": "qkv explain ffn · {model} · {layer}번 층 ({L}개 중) · “{token}”",
    "intro": "블록마다 상자가 둘 있습니다. 토큰 사이에 정보를 옮기는 어텐션, 그리고 토큰 하나씩 따로 변환하는 FFN입니다"
             "(가이드: 블록): FFN(h) = act(h·W_in + b_in)·W_out + b_out, 게이트가 있는 SwiGLU라면 "
             "(act(h·W_gate) ⊙ h·W_in)·W_out. 여기서는 토큰 하나의 벡터가 모델의 실제 가중치로 이 상자를 지나가는 "
             "과정을 한 단계씩 봅니다.",

    "s_place": "① FFN의 자리: {model}의 {layer}번 층",
    "place_pre": "프리-노름 블록입니다. 어텐션의 출력 a가 먼저 잔차 스트림에 더해지고, FFN은 그 스트림을 정규화해서 "
                 "읽습니다(h = Norm₂(x + a)). FFN의 출력도 스트림에 더해집니다:",
    "place_pre_bare": "이 블록에는 FFN 앞에 정규화가 없습니다. FFN은 스트림을 그대로 읽고(h = x + a, 어텐션 출력 a가 "
                      "이미 더해진 것), 그 출력이 스트림에 더해집니다:",
    "place_parallel": "병렬 블록입니다(GPT-NeoX). 어텐션과 FFN이 둘 다 블록의 입력 x를 각자의 정규화를 거쳐 읽고"
                      "(h = Norm₂(x)), 두 출력이 함께 x에 더해집니다:",
    "place_parallel_shared": "정규화가 하나인 병렬 블록입니다(Phi). 어텐션과 FFN이 둘 다 한 번 정규화한 블록 입력 "
                             "h = Norm₁(x)를 읽고, 두 출력이 함께 x에 더해집니다:",
    "place_post": "포스트-노름 블록입니다(BERT). 정규화가 각 잔차 뒤에 옵니다. FFN은 어텐션과 그 정규화를 거친 스트림 "
                  "h = Norm₁(x + a)를 읽고, 블록은 Norm₂(h + FFN(h))로 끝납니다:",
    "f_pre": "  h = Norm₂(x + a)        x ← x + a + FFN(h)",
    "f_pre_bare": "  h = x + a               x ← x + a + FFN(h)",
    "f_parallel": "  h = Norm₂(x)            x ← x + Attn(Norm₁(x)) + FFN(h)",
    "f_parallel_shared": "  h = Norm₁(x)            x ← x + Attn(h) + FFN(h)",
    "f_post": "  h = Norm₁(x + a)        x ← Norm₂(h + FFN(h))",
    "place_out_norm": "이 모델은 FFN의 출력도 스트림에 더하기 전에 정규화합니다(Gemma 2, OLMo 2처럼 상자 뒤에 놓인 "
                      "정규화): 더해지는 것은 Norm_out(FFN(h))입니다.",
    "place_mult": "상자마다 출력에 m = {m}을 곱한 뒤 스트림에 더합니다(Granite의 잔차 배율).",
    "place_numbers": "“{token}”(토큰 {n}개 중 {pos}번 위치)에서 블록에 들어오는 스트림은 ‖x‖ = {nx:.3f}이고, FFN이 "
                     "읽는 것은 ‖h‖ = {nh:.3f}, h = {h}입니다.",
    "dims": "FFN은 토큰의 d_model = {d_model}개 숫자를 d_ff = {d_ff}개(d_model의 {ratio:.2f}배)로 넓혔다가 다시 "
            "되돌립니다. 이 층의 FFN 가중치와 어텐션 가중치:",
    "col_matrix": "가중치", "col_shape": "모양", "col_params": "파라미터 수",
    "row_ffn": "FFN 합계", "row_attn": "어텐션 (W_Q, W_K, W_V, W_O)",
    "params_end": "이 층 가중치의 {share:.0%}가 FFN에 있습니다. 어텐션의 {ratio:.1f}배입니다.",
    "params_most": "이 블록이 저장하는 것의 대부분이 FFN에 있습니다.",

    "s_in": "② d_ff로 넓히기: u = h·W_in (+ b_in)",
    "s_in_gated": "② d_ff로 넓히기: u = h·W_in (+ b_in), 게이트 g = h·W_gate (+ b_gate)",
    "in": "W_in의 열 하나하나가 키입니다(Geva 등, 2021): 이 토큰의 h가 뉴런 i가 감지하는 패턴과 잘 맞을수록 "
          "u_i = h·W_in[:, i]{b} 값이 커집니다. h {hs} · W_in {ws} = u {us}:",
    "in_gated": "게이트가 있는 FFN에는 같은 모양의 행렬이 하나 더 있습니다: g = h·W_gate, 각 u_i를 얼마나 통과시킬지 "
                "정하는 {d_ff}개의 숫자입니다:",
    "largest": "가장 큰 값",

    "s_act": "③ 활성화 함수: a = {formula}",
    "act": "설정의 활성화 함수는 {name}입니다: {formula}.",
    "act_gelu": "GELU(u) = u·Φ(u), Φ는 정규분포의 누적분포함수(erf로 계산)입니다. 매끄럽고, u < 0에서는 0에 가까우며 "
                "−0.17보다 작아지지 않습니다",
    "act_gelu_tanh": "tanh 근사 GELU, ½u(1 + tanh(√(2/π)(u + 0.044715u³)))입니다. u < 0에서는 0에 가까우며 −0.17보다 "
                     "작아지지 않습니다",
    "act_silu": "SiLU(g) = g·σ(g)입니다(swish라고도 합니다). g < 0에서는 0에 가까우며 −0.28보다 작아지지 않습니다",
    "act_relu": "ReLU(u) = max(0, u)입니다. u < 0이면 정확히 0입니다",
    "act_relu2": "ReLU²(u) = max(0, u)²입니다. u < 0이면 정확히 0이고, 그 위에서는 u²로 커집니다",
    "act_xielu": "xIELU(u)는 u > 0이면 α_p·u² + β·u, 그 아래에서는 (e^min(u, ε) − 1 − u)·α_n + β·u입니다. α_p, α_n, "
                 "β, ε는 층마다 학습되거나 저장된 값입니다(Apertus). u ≪ 0이면 β·u − α_n·u에 가깝습니다",
    "act_gated": "게이트 방식({glu}): a = act(g) ⊙ u. 게이트 act(g)는 0에 가깝거나 양수이고 u는 부호가 어느 쪽이든 "
                 "될 수 있으므로, 뉴런의 a_i는 양수도 음수도 됩니다.",
    "act_counts": "은닉 벡터 a는 d_ff = {d_ff}개의 숫자입니다: 양수 {pos}개, 음수 {neg}개{zero}. 가장 큰 |a_i|는 "
                  "{amax:.3f}(뉴런 {imax})이고, 그 10%를 넘는 것은 {few}개({frac:.1%})입니다.",
    "zeros": ", 정확히 0인 것 {zero}개",

    "s_out": "④ d_model로 되돌리기: FFN(h) = a·W_out{b} = Σ_i a_i·W_out[i]{b}",
    "out": "W_out의 행 W_out[i]는 뉴런 i의 밸류입니다: 뉴런이 잔차 스트림에 a_i배만큼 써넣는 d_model = {d_model}개 "
           "숫자의 벡터입니다. a · W_out {ws}은 이런 벡터 {d_ff}개의 합입니다(Geva 등, 2021의 키–밸류 메모리: "
           "키는 얼마나, 밸류는 무엇을). FFN(h) = {y}, ‖FFN(h)‖ = {ny:.3f}.",
    "rank": "가장 많이 써넣는 뉴런 {top}개를 |a_i|·‖W_out[i]‖(각자 더하는 벡터의 길이) 순으로 놓고, 각 뉴런 하나만으로 "
            "FFN(h) 방향을 얼마나 가리키는지:",
    "col_rank": "#", "col_neuron": "뉴런 i", "col_cos_one": "cos(a_i·W_out[i], FFN(h))",
    "partial": "상위 k개만 더한 것{bias}을 전체 출력 FFN(h)와 비교하면:",
    "with_bias": "(b_out 포함)",
    "col_k": "상위 k", "col_of": "d_ff 중", "col_cos": "FFN(h)와의 cos", "col_rel": "‖FFN(h) − 부분합‖ / ‖FFN(h)‖",
    "col_share": "Σ|a_i|·‖W_out[i]‖ 중 비율",
    "partial_end": "부분합은 뉴런 {d_ff}개 중 k = {k90}개({frac:.1%})에서 처음으로 cos 0.9에 이릅니다. k = d_ff이면 "
                   "FFN(h)가 그대로 나옵니다. 그림은 모든 k에 대해 cos을 그립니다.",
    "out_norm_note": "(스트림에 더해지는 것은 이 합의 Norm_out입니다. 합 자체는 a에 선형이므로 부분들이 그대로 "
                     "더해지고, 그 뒤의 정규화가 전체의 크기를 바꿉니다.)",

    "s_vocab": "⑤ 상위 뉴런이 써넣는 것을 W_vocab으로 읽기",
    "vocab": "로짓 렌즈가 스트림을 읽듯이 읽습니다: 스트림에 써넣은 벡터 v는 어휘 전체에 (v ⊙ γ)·W_vocab만큼 점수를 "
             "줍니다. γ는 최종 정규화의 스케일입니다(LayerNorm이면 v를 먼저 평균 0으로 옮기고, 정규화의 1/rms와 "
             "바이어스는 빼므로 v 한 단위당 값입니다). 뉴런 i는 a_i·W_out[i]를 써넣으므로 부호는 a_i를 따릅니다. "
             "|a_i| 한 단위당 올리는 토큰(촉진)과 내리는 토큰(억제):",
    "col_promoted": "촉진", "col_suppressed": "억제",
    "vocab_out": "이 토큰에서 스트림에 더해지는 FFN 출력 전체가 촉진하는 토큰은 {up}, 억제하는 토큰은 {down}입니다.",
    "skip_no_head": "{model}에는 LM 헤드(W_vocab)가 없습니다. 은닉 상태에서 끝나므로 뉴런이 촉진할 토큰이 없어 이 "
                    "단계는 건너뜁니다.",
    "skip_mlm_head": "{model}은(는) W_vocab 앞에 마스크드 LM 헤드(밀집층, 활성화, LayerNorm)를 거쳐 로짓을 읽습니다. "
                     "이 헤드는 스트림에 선형이 아니므로 스트림에 써넣은 벡터 하나에는 제 로짓이 없어 이 단계는 "
                     "건너뜁니다.",

    "s_check": "⑥ 검사: 모든 숫자를 엔진과 비교",
    "check": "위의 h, u, a, FFN(h)는 이 층의 가중치로 여기서 float64로 계산했습니다. 스트림에 더해지는 것은 "
             "“{token}”에서 엔진이 계산한 ffn_out과 같습니다(최대 차이 {diff:.1e}, |ffn_out|의 최댓값 {big:.3f}).",
    "check_neurons": "a는 엔진의 은닉 활성, 즉 트레이스의 “neurons”와 같습니다(최대 차이 {diff:.1e}).",
    "check_no_neurons": "(이 엔진은 FFN의 은닉 활성을 기록하지 않으므로 a는 ffn_out으로만 검사합니다.)",
    "check_sum": "벡터 a_i·W_out[i] {d_ff}개를 하나씩 더하면 a·W_out이 그대로 나옵니다(최대 차이 {diff:.1e}): "
                 "k = d_ff의 cos은 {cos:.6f}입니다.",
    "stored": "{model}은(는) 이 가중치를 GGUF 파일의 블록({kinds}) 그대로 두고, 엔진은 그 블록을 제자리에서 곱합니다. "
              "여기서는 이 층의 행렬 {k}개를 float32로 역양자화했습니다({size}, {ms:.0f} ms). 엔진의 곱은 바로 이 "
              "값들과의 곱과 같습니다.",

    "fig_tenth": "가장 큰 |a_i|의 ±10%", "fig_top": "가장 많이 써넣는 {k}개 (|a_i|·‖W_out[i]‖)",
    "fig_neuron": "뉴런 i", "fig_a": "{model} · {layer}번 층 · “{token}”: 은닉 벡터 a (뉴런 {d_ff}개)",
    "fig_k": "k (|a_i|·‖W_out[i]‖가 큰 뉴런부터)", "fig_cos": "cos(상위 k 부분합, FFN(h))",
    "fig_partial": "출력을 만드는 뉴런은 몇 개인가",
    "fig_one": "뉴런 {i} (a = {a:+.2f})가 써넣는 것", "fig_whole": "FFN 출력 전체",
    "fig_promoted": "{model} · {layer}번 층 · “{token}”: 촉진되는 토큰(초록)과 억제되는 토큰(빨강)",
}

# qkv explain flash (lessons.flash)
FLASH = {
    "title": "qkv explain flash · {model} · {layer}번 층 · {head}번 헤드 · n = {n}",
    "intro": "softmax는 가중치를 하나라도 알려면 행 전체, 즉 그 최댓값과 합이 필요합니다. 토큰이 n개이면 그 행들이 "
             "n × n 점수 행렬 S입니다(가이드: FlashAttention). FlashAttention은 S를 통째로 들고 있지 않습니다. 키를 타일 단위로 "
             "훑으면서 쿼리마다 지금까지의 최대 점수 m, exp(s − m)의 누적합 ℓ, 누적 출력 acc만 유지합니다. 어떤 "
             "타일이 최댓값을 키우면 exp(m_old − m_new) < 1이 이전 최댓값 기준으로 더한 값들을 다시 맞추므로, "
             "어떤 타일도 두 번 방문하지 않습니다:",
    "s_row": "① 쿼리 한 행, 타일 하나씩: “{token}”",
    "row": "“{token}”(행 {row})의 쿼리를 n = {n}개의 키와 비교합니다. 키는 {block}개씩 {T}개 타일입니다. s는 이 실제 "
           "헤드의 q·k/√d_k이고, acc는 d_k = {d_k}개의 값입니다:",
    "col_tile": "타일", "col_keys": "키", "col_scores": "점수 s", "col_acc": "acc (앞 {k}개)",
    "grew": "최댓값이 타일 {tiles}에서 커졌습니다. 거기서 exp(m_old − m_new) < 1이 더 작은 최댓값 기준으로 더해 둔 "
            "ℓ과 acc를 줄였습니다. 최댓값이 그대로인 곳에서는 배율이 1입니다.",
    "held": "이 행의 최댓값이 첫 타일에 있어서 이후의 배율은 모두 1입니다: 다시 맞출 필요가 없었습니다"
            "(다른 헤드에서는 볼 수 있습니다).",
    "prefix": "타일마다 acc / ℓ은 이미 지금까지 본 키에 대한 어텐션입니다: 그 키들에 대한 softmax · V와 같습니다"
              "(최대 차이 {diff:.1e}, float64).",
    "s_end": "② 끝: Z = acc / ℓ",
    "end_check": "행 전체를 한 번에 계산한 softmax(S)·V와 같고(최대 차이 {plain:.1e}, 둘 다 float64), 타일 {block}의 "
                 "엔진 타일 커널 `kernels.tiled_attention`과 같으며(float32, {kernel:.1e}), 모델이 계산한 Z와도 "
                 "같습니다({model:.1e}). 점수 자체도 모델의 것과 같습니다({scores:.1e}).",
    "s_block": "③ 쿼리 블록: 행 {q0}–{q1}",
    "block": "커널은 쿼리를 블록 단위로 한꺼번에 처리합니다. 행마다 자기 m과 ℓ을 유지하고, 점수 타일 하나"
             "(블록 × 블록)를 모든 행이 함께 씁니다. 이 블록에서 각 키 타일은: {kinds}.",
    "col_query": "쿼리", "skipped": "건너뜀",
    "k_full": "계산", "k_partial": "계산, 일부 마스크", "k_hidden": "건너뜀 (모든 키가 가려짐)",
    "block_check": "블록의 출력은 엔진의 타일 커널(최대 차이 {kernel:.1e}), 모델의 출력({model:.1e})과 같습니다.",
    "s_memory": "④ 타일이 아끼는 것",
    "grid": "전체 격자: 타일 {T}개 중 {visited}개를 계산하고, 인과 마스크가 완전히 가리는 {hidden}개는 건너뜁니다"
            "(`qkv explain sparse`가 어떤 패턴에든 적용하는 것과 같은 검사입니다).",
    "memory": "메모리: n = {n}, 헤드 H = {H}개일 때 S 전체는 H·n²개의 float = {dense}입니다. 엔진의 커널은 헤드마다 "
              "{bq} × {bk} 점수 타일 하나 = {tile}만 들고 있습니다. {ratio:.0f}배 적고, 결과는 같습니다.",
    "skip": "건너뜀",
    "fig_grid": "{model} · {layer}번 층 · {head}번 헤드: 타일 {block}, 방문 순서",
    "fig_tile": "타일",
    "fig_running": "“{token}”의 행: 타일마다 누적 최댓값 m과 합 ℓ",
    "fig_step": "타일 {tile}: 키 {k0}–{k1}",
    "fig_end": "Z (앞 {k}개 값): acc/ℓ = softmax·V ({diff:.0e})",
    "fig_steps": "“{token}”의 온라인 softmax · {model} · {layer}번 층 · {head}번 헤드: 주황 = 이번 타일, "
                 "파랑 = 본 키, 회색 = 아직; 점선 = m",
}

# qkv explain gqa (lessons.gqa)
GQA = {
    "title": "qkv explain gqa · {model}",
    "intro": "멀티헤드 어텐션에서는 헤드마다 W_Q, W_K, W_V가 따로 있습니다(가이드: 헤드). 모델이 글을 생성할 때는 지나간 "
             "모든 토큰의 K와 V를 KV 캐시에 저장하는데, 이 캐시는 헤드 수만큼 커집니다. GQA와 MQA"
             "(가이드: GQA)는 여러 쿼리 헤드가 K/V 헤드 하나를 함께 읽게 합니다: 쿼리는 그대로 많고, 캐시는 "
             "줄어듭니다.",

    "s_share": "① 누가 무엇을 읽나: 쿼리 헤드 {H}개, K/V 헤드 {H_kv}개",
    "mha": "{model}은(는) 평범한 멀티헤드 어텐션(MHA)입니다: 쿼리 헤드 {H}개가 각자 자기 K/V 헤드를 읽습니다(h → h). "
           "공유하는 것이 없습니다. 공유하면 어떻게 되는지는 ③에서 봅니다.",
    "mla": "{model}은 멀티헤드 잠재 어텐션(MLA)입니다: 쿼리 헤드 {H}개가 저마다 자기 K와 V를 읽지만(h → h), 모두 토큰마다 "
           "잠재 벡터 하나(r_kv = {r_kv}개 숫자: [K_nope | V] = c·W_KV_b)에서 펼쳐지고, 각 헤드 K의 RoPE 부분(d_k = {d_k} "
           "중 마지막 d_rot = {d_rot})은 MQA처럼 모든 헤드가 함께 쓰는 키 하나입니다. 아래에서 모델 자신의 K로 확인합니다. "
           "③은 대신 보통의 멀티헤드 모델을 풀링합니다.",
    "share": "W_Q는 토큰마다 쿼리 H = {H}개를 만들고, W_K와 W_V는 키와 밸류를 Hkv = {H_kv}개만 만듭니다: Q {kq}, "
             "K와 V {kk}. 쿼리 헤드 h는 K/V 헤드 h // (H/Hkv) = h // {G}를 읽습니다: 이웃한 {G}개씩 한 그룹.",
    "col_kv": "K/V 헤드", "col_queries": "이를 읽는 쿼리 헤드",
    "share_check": "{layer}번 층의 헤드 {H}개 점수를 Q_h·K_(h // G)ᵀ/√d_k로 다시 계산하면 모델의 점수와 같습니다"
                   "(최대 차이 {diff:.1e}).",

    "s_cache": "② 줄어드는 캐시",
    "cache": "KV 캐시는 토큰마다 모든 층의 K와 V를 저장합니다: 2·L·Hkv·d_k·4 바이트(L = {L}, d_k = {d_k}, float32). "
             "같은 모델에서 쿼리 헤드마다 K/V 헤드를 하나씩 두는 경우(MHA), 이 모델(←), 모두가 하나를 쓰는 경우(MQA):",
    "cache_latent": "MLA의 캐시는 토큰마다 층마다 K와 V가 아니라 잠재 벡터 하나와 RoPE 키 하나를 담습니다: "
                    "L·(r_kv + d_rot)·4 바이트(L = {L}, r_kv = {r_kv}, d_rot = {d_rot}, float32). 펼친 헤드를 캐시한다면 "
                    "L·Hkv·(d_k + d_v)·4 (d_k = {d_k}, d_v = {d_v}), K/V 헤드 H개(MHA) 또는 1개(MQA). 이 모델(←):",
    "col_attention": "어텐션", "col_kv_heads": "K/V 헤드", "col_per_token": "토큰당 바이트",
    "col_ratio": "MHA 대비",
    "cache_end": "{model}은(는) MHA보다 토큰당 {saved:,} 바이트를 아낍니다: 캐시가 {ratio:.0f}분의 1입니다"
                 "(`qkv explain kv-cache`가 생성하면서 측정합니다).",

    "s_pool": "③ MHA를 GQA로 바꾸기: {model}의 K/V 헤드 평균 풀링",
    "pool": "GQA 논문(Ainslie 등, 2023)은 멀티헤드 모델의 K, V 투영 헤드를 평균 내어 그룹으로 묶습니다: 그룹 g는 이웃한 "
            "H/G개 헤드의 W_K(그리고 W_V와 바이어스) 평균을 모든 층에서 받고, 각 쿼리 헤드는 자기 그룹의 K/V 헤드를 "
            "읽습니다. 여기서는 {model}(H = {H})에 H의 모든 약수 G로 적용하고, 다시 학습하지 않은 채 {text!r}"
            "({n}개 토큰)로 실행합니다. 출력이 얼마나 달라지는지:",
    "col_groups": "K/V 헤드 G", "col_queries_per": "K/V 헤드당 쿼리 헤드",
    "col_rel": "마지막 은닉 상태의 상대 오차", "col_cos": "문장 임베딩의 cos",
    "pool_check": "G = {H}이면 각 헤드를 자기 자신과 평균하므로 모델이 정확히 그대로입니다(오차 {rel:g}). 풀링한 모델은 "
                  "모두, 풀링한 K/V 헤드를 반복해 넣은 밀집 멀티헤드 모델과 같습니다(최대 차이 {diff:.1e}): 공유는 "
                  "같은 계산을 더 싸게 하는 방법일 뿐입니다.",
    "pool_end": "K/V 헤드가 적을수록 출력이 더 멀어집니다: G = {G}(MQA)에서 마지막 은닉 상태의 오차는 {rel:.0%}, 문장 "
                "임베딩과 원래 임베딩의 cos는 {cos:.3f}입니다. 헤드들이 공유하도록 학습되지 않았기 때문입니다. 그래서 "
                "논문은 풀링한 모델을 조금 더(원래 학습 단계의 5%) 학습시켜 품질을 되찾고, SmolLM2 같은 모델은 처음부터 "
                "GQA로 학습합니다.",

    "fig_q": "쿼리 헤드", "fig_kv": "K/V 헤드", "fig_map": "{model}: 쿼리 헤드 {H}개 → K/V 헤드 {H_kv}개",
    "fig_rel": "마지막 은닉 상태의 상대 오차", "fig_cos": "1 − cos, 문장 임베딩",
    "fig_groups": "평균 풀링 후 K/V 헤드 수 (G)", "fig_pool": "{model} (H = {H}), K/V 헤드 평균 풀링",
}

# qkv explain kv-cache (lessons.kvcache)
KVCACHE = {
    "title": "qkv explain kv-cache · {model}",
    "intro": "LLM은 글을 한 토큰씩 생성하고(가이드: 온도), 새 토큰의 쿼리는 앞선 모든 토큰의 키와 밸류를 만나야 합니다. "
             "한 번 계산한 K와 V는 바뀌지 않으므로(인과 마스킹: 어떤 토큰도 미래를 보지 않음), KV 캐시는 매 "
             "단계마다 전체 텍스트를 다시 계산하는 대신 이를 저장합니다. 추론 속도의 핵심입니다(가이드: KV 캐시).",

    "s_holds": "① 캐시에 담기는 것",
    "holds": "층마다 shape (Hkv, m, d_k)의 K 하나와 V 하나: K/V 헤드 Hkv = {H_kv}개(쿼리 헤드는 H = {H}개, GQA), "
             "지금까지의 토큰 m개, d_k = {d_k}; 층 L = {L}개. 키는 RoPE를 적용한 뒤 저장합니다. 프롬프트({n}개 토큰: "
             "{prompt}) 뒤에 각 층은 K {shape}와 V {shape}를 담습니다: float32로 토큰당 2·L·Hkv·d_k·4 = {per:,} "
             "바이트.",
    "holds_check": "생성 후의 캐시는 같은 {n}개 토큰으로 전체 계산을 한 번 돌린 K, V와 모든 층에서 같습니다"
                   "(최대 차이 {diff:.1e}).",

    "holds_state": "{L_all}개 층 중 {k}개는 K와 V 대신 {kind} 상태를 둡니다. 그 크기는 고정되어 float32로 모두 "
                   "{state:,}바이트이고, 토큰 하나 뒤에도 100,000개 뒤에도 같습니다(KVCache.state_bytes). K와 V는 "
                   "어텐션 층 {L}개만 두며, 토큰마다 {per:,}바이트씩 늘어납니다.",
    "holds_state_beside": "{L_all}개 층 모두 어텐션의 K와 V 옆에 {kind} 상태도 둡니다. 그 크기는 고정되어 float32로 "
                          "모두 {state:,}바이트이고, 토큰 하나 뒤에도 100,000개 뒤에도 같습니다(KVCache.state_bytes). "
                          "K와 V는 토큰마다 {per:,}바이트씩 늘어납니다.",
    "holds_latent": "멀티헤드 잠재 어텐션(MLA): 층마다 캐시는 토큰마다 잠재 벡터 c = RMSNorm(x·W_V)(r_kv = {r_kv}개 "
                    "숫자)와 RoPE를 적용한 키 k_R(d_rot = {d_rot}개 숫자, H = {H}개 헤드가 함께 씀)을 담습니다. 헤드마다의 "
                    "K와 V가 아닙니다. 프롬프트({n}개 토큰: {prompt}) 뒤에 각 층은 c {c}와 k_R {k}를 담습니다: float32로 "
                    "토큰당 L·(r_kv + d_rot)·4 = {per:,} 바이트(L = {L}). 매 단계 이를 다시 헤드마다의 K = [K_nope | k_R]"
                    "(c·W_KV_b의 d_nope = {d_nope}개, 모두 d_k = {d_k})와 V(d_v = {d_v}, c·W_KV_b의 나머지)로 펼칩니다. "
                    "qkv의 캐시도 transformers의 캐시도 이것을 담습니다. 둘 다 W_KV_b를 W_Q와 W_O에 미리 곱해 두지 않으므로"
                    "(DeepSeek 자체 추론의 기법) 펼치는 계산은 매 단계 일어납니다(③). 펼친 K와 V를 캐시한다면 토큰당 "
                    "L·H·(d_k + d_v)·4 = {full:,} 바이트입니다.",
    "holds_check_latent": "생성하며 캐시한 잠재 벡터를 K와 V로 펼치면, 같은 {n}개 토큰으로 전체 계산을 한 번 돌린 K, V와 "
                          "모든 층에서 같습니다(최대 차이 {diff:.1e}).",
    "s_steps": "② 한 토큰씩: 새 토큰 {k}개, greedy",
    "steps": "1단계는 프롬프트({prompt}개 토큰)를 넣습니다(prefill). 이후 단계는 방금 고른 토큰 하나만 넣고, 그 "
             "쿼리가 캐시된 키 m개를 읽습니다. \"캐시 없음\"은 m개 토큰 전체를 다시 계산합니다. 시간: 3번 실행 중 "
             "가장 빠른 값, 이 컴퓨터에서 지금 측정(한 토큰 단계는 qkv가 생성할 때처럼 BLAS 스레드 1~2개).",
    "col_token": "토큰", "col_fed": "입력", "col_shape": "층당 K", "col_bytes": "캐시",
    "col_ms_cache": "ms, 캐시", "col_ms_full": "ms, 캐시 없음", "col_flops_cache": "FLOPs, 캐시",
    "col_flops_full": "FLOPs, 캐시 없음", "col_same": "같은 토큰 · 최대 |Δlogit|",
    "text": "생성된 텍스트: {text!r}",
    "same": "두 방식 모두 같은 토큰 {k}개를 고릅니다. logits 차이는 최대 {diff:.1e}입니다(허용 오차: 가장 큰 logit의 "
            "{tol:g}배): 캐시는 비용을 바꿀 뿐 결과는 바꾸지 않습니다.",

    "s_cost": "③ 한 단계의 비용",
    "flops": "FLOPs는 가중치의 shape에서 셉니다(곱셈-덧셈 하나에 2). 토큰 f개를 넣고 그 쿼리가 키 m개를 읽는 계산: "
             "L·[2·f·d_model·(H + 2·Hkv)·d_k (Q, K, V) + 4·H·f·m·d_k (Q·Kᵀ와 A·V) + 2·f·H·d_k·d_model (W_O) + "
             "{ffn}·2·f·d_model·d_ff (FFN)] + 2·d_model·V (마지막 토큰의 logits). d_model = {d_model}, H = {H}, "
             "Hkv = {H_kv}, d_k = {d_k}, d_ff = {d_ff}, L = {L}, V = {V:,}. 캐시가 있으면 f = 1, 없으면 f = m.",
    "flops_state": "L = {L}은 {L_all}개 층 중 어텐션을 하는 층만 셉니다. {k}개 층의 {kind} 상자(와 어텐션을 하지 "
                   "않는 층의 FFN)는 빠집니다: 상태가 있으면 그 비용은 m과 상관없이 한 단계마다 같습니다.",
    "flops_latent": "FLOPs는 가중치의 shape에서 셉니다(곱셈-덧셈 하나에 2). 토큰 f개를 넣고 그 쿼리가 키 m개를 읽는 "
                    "계산: L·[2·f·d_model·(r_q + r_kv + d_rot) + 2·f·r_q·H·d_k (잠재 벡터를 거친 q, 없으면 "
                    "2·f·d_model·H·d_k; K/V 잠재 벡터와 RoPE 키) + 2·m·r_kv·H·(d_nope + d_v) (캐시된 잠재 벡터를 매 단계 "
                    "K와 V로 펼침) + 2·H·f·m·(d_k + d_v) (Q·Kᵀ와 A·V) + 2·f·H·d_v·d_model (W_O) + "
                    "{ffn}·2·f·d_model·d_ff (FFN)] + 2·d_model·V (마지막 토큰의 logits). d_model = {d_model}, H = {H}, "
                    "r_q = {r_q}, r_kv = {r_kv}, d_rot = {d_rot}, d_nope = {d_nope}, d_k = {d_k}, d_v = {d_v}, "
                    "d_ff = {d_ff}, L = {L}, V = {V:,}. 캐시가 있으면 f = 1, 없으면 f = m.",
    "cost": "m = {m}에서: 캐시 있음 {fc:,.0f}M FLOPs, 캐시 없음 {ff:,.0f}M({fr:.1f}배). 한 토큰 단계 {k}개의 측정 "
            "시간 합: 캐시 있음 {tc:.0f} ms, 캐시 없음 {tf:.0f} ms({tr:.1f}배). 캐시가 있으면 한 단계의 비용은 m과 "
            "거의 무관하고, 캐시가 없으면 m에 따라 커집니다(어텐션 부분은 m²으로).",
    "ratio_memory": "시간 비율이 FLOPs 비율보다 작은 이유: 한 토큰 단계는 가중치를 모두 읽어 한 행만 계산하고(메모리 "
                    "대역폭이 한계), 전체 계산은 가중치를 한 번 읽을 때마다 m개 행을 계산합니다(연산 속도가 한계).",
    "ratio_busy": "여기서는 시간 비율이 FLOPs 비율보다 작지 않습니다. 한가한 컴퓨터에서는 작아지는데(한 토큰 단계는 "
                  "메모리 대역폭이, 전체 계산은 연산 속도가 한계), 이 컴퓨터의 다른 작업이 실행을 늦췄습니다. "
                  "FLOPs는 컴퓨터와 무관하지만 시간은 그렇지 않습니다.",

    "s_layouts": "④ MHA, GQA, MQA: 같은 모델의 캐시 크기",
    "col_attention": "어텐션", "col_kv_heads": "K/V 헤드", "col_per_token": "토큰당 바이트",
    "col_now": "이번 {n}개 토큰", "col_context": "전체 컨텍스트",
    "layouts": "토큰당 바이트 = 2·L·Hkv·d_k·4(K와 V, 층 L = {L}개, d_k = {d_k}, float32). 이번 실행의 토큰과 모델의 "
               "전체 컨텍스트 {context:,}개 토큰에 대해(← 이 모델):",
    "layouts_end": "쿼리 헤드마다 K/V 헤드를 하나씩 두면(MHA, H = {H}) 캐시가 {saving:.0f}배 커집니다. 공유 K/V 헤드 "
                   "{H_kv}개(GQA)는 이 모델의 선택이고, MQA(K/V 헤드 1개)는 MHA보다 {mqa:.0f}배 작습니다"
                   "(`qkv explain gqa`).",
    "layouts_state": "각 행에 {kind} 상태 {k}개의 {state_h}를 길이와 상관없이 더하세요: 전체 컨텍스트 {context:,}토큰에서 "
                     "이 모델의 K와 V는 {kv}, 상태는 여전히 {state_h}입니다.",
    "layouts_latent": "토큰당 바이트: MLA 자신의 L·(r_kv + d_rot)·4 (L = {L}, r_kv = {r_kv}, d_rot = {d_rot}, "
                      "float32). 펼친 헤드를 캐시한다면 L·Hkv·(d_k + d_v)·4 (d_k = {d_k}, d_v = {d_v}): K/V 헤드 H개(MHA) "
                      "또는 1개(MQA). 이번 실행의 토큰과 모델 전체 컨텍스트 {context:,} 토큰 기준(← 이 모델):",
    "layouts_end_latent": "잠재 벡터는 그것이 대신하는 H = {H}개 헤드의 K와 V(MHA)보다 {saving:.1f}배 작습니다. 모두가 "
                          "K/V 헤드 하나를 함께 쓰면(MQA) 잠재 벡터의 {mqa:.2f}배입니다: MLA는 헤드마다 자기 K와 V를"
                          "(W_KV_b를 거쳐) MQA 캐시 정도의 크기로 유지합니다.",

    "fig_full": "캐시 없음", "fig_cache": "캐시 있음", "fig_m": "지금까지의 토큰 수 m",
    "fig_time": "한 단계의 시간(측정)", "fig_flops": "한 단계의 FLOPs(계산)", "fig_tokens": "토큰 수",
    "fig_memory": "{model}: KV 캐시, float32", "fig_state": "{kind} 상태 (고정)",
}

# qkv explain positions (lessons.positions)
POSITIONS = {
    "title": "qkv explain positions · {model}",
    "intro": "어텐션만으로는 순서를 모릅니다: 토큰 순서를 섞어도 점수 S[i, j]는 그대로입니다. 그래서 모델은 각 토큰의 "
             "위치 정보를 넣습니다(가이드: 위치): 초기 트랜스포머는 사인/코사인 함수를 X에 더했고, BERT는 학습된 위치 "
             "테이블을, 최신 LLM은 대부분 Q와 K를 위치만큼 회전시킵니다(RoPE). 이 모델은 {kind}을(를) 씁니다.",
    "kind_rope": "RoPE", "kind_learned": "학습된 위치 테이블", "kind_sinusoidal": "사인/코사인 위치 인코딩",
    "kind_relative": "거리 구간마다 학습된 바이어스(T5)",
    "kind_alibi": "ALiBi: 점수에 더하는 고정 바이어스, 헤드마다의 기울기 × 키의 위치(BLOOM, Falcon)",

    "s_sin": "① 사인/코사인 위치 인코딩(Vaswani 등, 2017)",
    "sin_what": "PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)), d = d_model = {d}: "
                "열 두 개가 한 쌍의 파동이고, 첫 쌍은 위치마다 1 rad, 마지막 쌍은 {w_last:.1e} rad씩 돕니다. "
                "앞쪽 위치들(히트맵은 --out, shape {shape}):",
    "col_pos": "p", "col_closed": "Σ cos(k·ω_i)",
    "sin_check": "qkv.core.positions.sinusoidal_table이 float64로 계산한 수식과 같습니다(최대 차이 {diff:.1e}).",
    "sin_dot": "왜 파동인가: 두 위치 인코딩의 내적 PE(p)·PE(p+k) = Σ_i cos(k·ω_i)({half}개 쌍의 합)는 p가 아니라 "
               "거리 k에만 달려 있습니다:",
    "sin_dot_end": "모든 p에서 같고(p에 따른 최대 차이 {spread:.1e}) Σ cos(k·ω_i)와 같습니다. k = 0에서 가장 크고"
                   "(d/2 = {d}/2) 토큰이 멀어질수록 작아집니다(k = 64에서 {far:.1f}).",

    "s_rope": "② RoPE: 위치만큼 회전하는 Q와 K",
    "no_rope": "{model}에는 RoPE가 없습니다({kind} 사용). LLM에서 보려면 `qkv explain positions --model smollm2`를 "
               "실행하세요.",
    "rope_what": "RoPE는 X에 아무것도 더하지 않습니다. 쿼리와 키를 회전시킵니다: d_k = {d_k}개의 숫자가 {half}개의 쌍 "
                 "(i, i + {half})을 이루고, 쌍 i는 p·ω_i만큼 돕니다. ω_i = θ^(−2i/d_k), θ = {theta:g}. 빠른 쌍은 "
                 "가까운 위치를, 느린 쌍은 먼 위치를 구별합니다. 각도(rad):",
    "col_pair_i": "쌍 i", "col_wave": "파장(토큰)",
    "rope_omega_check": "qkv.core.positions.rope_inv_freq가 float64로 계산한 θ^(−2i/d_k)와 같습니다(최대 차이 "
                        "{diff:.1e}).",
    "rope_turn": "실제 쿼리 하나: {layer}번 층, {head}번 헤드, 토큰 “{token}”(키는 {kv}번 K/V 헤드에서). 같은 벡터를 "
                 "위치 0, 1, 2, 3에 놓으면 각 쌍이 회전하고 길이 |q|는 그대로입니다.",
    "col_pair": "쌍 ({i}, {j})",
    "rope_trace_check": "RoPE 전의 쿼리와 키를 다시 계산해 엔진의 RoPE로 실제 위치만큼 회전시키면 모델의 q, k와 "
                        "같습니다(최대 차이 {diff:.1e}).",
    "rope_relative": "이제 내용을 고정합니다: “{q}”의 쿼리(텍스트의 {qp}번 위치)와 “{k}”의 키({kp}번 위치)를 어디에든 "
                     "놓습니다: 쿼리는 p + k, 키는 p. q·k:",
    "rope_relative_end": "각 행은 모든 p에서 같습니다: RoPE 뒤의 q·k는 거리 k에만 달려 있습니다(p에 따른 최대 차이: "
                         "엔진의 float32 각도로 {spread:.1e}, float64로 {spread64:.1e}; 엔진과 float64의 차이 "
                         "{diff:.1e}). 거리에 따라 점수가 어떻게 변하는지는 내용이 정합니다. 여기서는 k = 0..64에서 "
                         "{lo:.1f}부터 {hi:.1f}까지.",

    "s_learned": "③ 학습된 위치 테이블: {model}",
    "learned_what": "{model}은(는) 위치마다 벡터 하나를 학습했고(P {shape}), 토큰 임베딩에 P[p]를 더합니다. 학습 "
                    "과정에서 P[p]·P[p+k]가 k만의 함수가 되도록 강제하는 것은 없습니다. 두 행의 코사인 유사도를 "
                    "거리별로, 모든 p에 대해:",
    "learned_check": "0번 층의 X를 E[ids] + P[위치] (+ 세그먼트, 그다음 LayerNorm)로 다시 계산하면 모델의 값과 "
                     "같습니다(최대 차이 {diff:.1e}): 모델이 더하는 것이 바로 이 테이블입니다.",
    "col_mean_cos": "평균 cos", "col_min": "최솟값", "col_max": "최댓값",
    "learned_end": "파동처럼 가까운 위치는 비슷하고 먼 위치는 덜 비슷하지만, 평균적으로만 그렇습니다: 같은 거리라도 "
                   "p마다 코사인이 다릅니다. {model}은(는) 마지막 행 너머의 위치는 읽지 못합니다.",
    "end": "사인/코사인과 RoPE는 구조상 점수를 거리의 함수로 만들고, 학습된 테이블은 이를 근사할 뿐입니다. RoPE는 "
           "어텐션이 토큰을 비교하는 바로 그곳, q·k 안에서 이를 해냅니다.",

    "fig_dim": "쌍 i: 왼쪽 sin(p·ω_i), 오른쪽 cos(p·ω_i)", "fig_pos": "위치 p", "fig_dist": "거리 k",
    "fig_sin_table": "PE(p, 2i) | PE(p, 2i+1), d = {d}", "fig_sin_dot": "PE(p)·PE(p+k): 모든 p에서 같은 곡선",
    "fig_pair": "쌍", "fig_angle": "각도 p·ω_i mod 2π (rad)", "fig_rope_angle": "RoPE 회전 각도, θ = {theta:g}",
    "fig_rope_dot": "RoPE 뒤의 q·k, {layer}번 층 {head}번 헤드 ({q} → {k})\n모든 p에서 같은 곡선",
    "fig_learned_cos": "{model}: cos(P[p], P[p'])", "fig_range": "p에 따른 최솟값..최댓값",
    "fig_mean": "p에 대한 평균", "fig_learned_dist": "학습된 테이블: k의 함수에 가까울 뿐",
}

# qkv explain sparse (lessons.sparse)
SPARSE = {
    "title": "qkv explain sparse · {model} · n = {n} 토큰",
    "intro": "전체 어텐션은 모든 쿼리를 모든 키와 비교합니다: n² 쌍, 점수 행렬의 O(n²)입니다(가이드: 점수). 희소 패턴은 쿼리마다 "
             "일부 키만 남기고 나머지에는 M = −∞를 더합니다. n × n 행렬 전체에 M을 더하면 아무것도 절약되지 "
             "않습니다. 타일 커널(FlashAttention의 온라인 softmax, `qkv explain flash` 참고)은 (쿼리 블록, 키 블록) "
             "타일마다 패턴에 그 타일이 완전히 가려지는지 묻고, 그렇다면 건너뜁니다: Q·Kᵀ도, exp도, P·V도 없습니다.",
    "s_own": "⓪ 모델 자신의 마스크: 각 층이 실제로 쓴 것",
    "own": "{model}은 스스로 희소하게 어텐션합니다. 이 n = {n} 토큰에서 각 층의 마스크(0: 가림, 1: 보임, 2 이상: 커널이 "
           "그 횟수만큼 세는 키 — BigBird의 평가 모드는 무작위 블록마다 블록 0을 읽습니다)와, 그 층의 q, k, v로 계산한 "
           "softmax(Q·Kᵀ/√d_k + log c)·V(Longformer의 전역 행은 자신의 Q, K, V로)의 모델 출력 Z 대비 오차:",
    "col_layer": "층", "col_mask": "마스크", "col_copies": "최대 중복", "col_own_error": "Z의 오차",
    "own_end": "오차 0(부동소수점 반올림)은 그린 마스크가 모델이 실제로 쓴 마스크라는 확인입니다. 아래 패턴 모음은 이 "
               "모델이 쓰지 않는, 같은 q, k, v의 밀집 어텐션에 대해 잽니다.",
    "fig_own": "{model}, n = {n}: 각 층이 쓴 마스크 (진한 색: 두 번 이상 센 키)",
    "fig_own_kept": "쌍의 {d:.1%} · Z의 오차 {e:.0e}",
    "s_gallery": "① 패턴 모음: 각 쿼리가 보는 키",
    "gallery": "n = {n}을 {block} × {block} 타일로 나눕니다({causal}). 패턴이 타일 전체를 남기면 마스크 없이, "
               "일부만 남기면 마스크와 함께 계산하고, 하나도 남기지 않으면 건너뜁니다:",
    "mode_causal": "인과: 토큰은 뒤의 토큰을 보지 않음",
    "mode_not_causal": "비인과: 모든 토큰이 서로를 볼 수 있음",
    "col_pattern": "패턴", "col_defined": "정의 (qkv.core.sparse)", "col_density": "남긴 쌍", "col_tiles": "계산한 타일",
    "col_skipped": "건너뜀",
    "gallery_end": "커널이 건너뛴 타일 수는 패턴이 가리는 타일 수와 같습니다(확인함). 윈도우, 팽창(dilated), "
                   "블록 패턴은 O(n·w) 쌍을 남기고, 전역 토큰은 행 하나와 열 하나를 더하며, BigBird의 무작위 "
                   "블록은 쿼리 블록마다 고정된 비용으로 멀리까지 닿습니다.",
    "s_error": "② 실제 모델에서 각 패턴이 잃는 것",
    "error": "{model}이 {one}개 토큰의 문단을 {copies}번 반복해 읽습니다(n = {n}). 트레이스에서 가져온 모든 층의 "
             "q, k, v를 각 패턴에 통과시킵니다. 오차: 모델 자신의 출력 Z에 대한 ‖Z_sparse − Z‖ / ‖Z‖, "
             "{H}개 헤드의 평균을 {L}개 층에 대해 다시 평균(과 가장 나쁜 층). 남은 질량: 모델의 어텐션 가중치 A 중 "
             "패턴이 남긴 키에 놓인 몫.",
    "col_error": "Z의 오차", "col_worst": "가장 나쁜 층", "col_mass": "남은 A의 질량",
    "error_check": "확인: 밀집(dense) 패턴은 모든 층에서 모델의 Z를 그대로 냅니다(최대 차이 {dense:.1e}). 각 패턴의 "
                   "Z는 모델의 A를 패턴으로 자르고 행마다 다시 정규화해 V를 곱한 것과 같습니다(최대 차이 "
                   "{worst:.1e}): 남긴 키에 대한 softmax가 정확히 그것입니다.",
    "sink": "앞에서 w = {w} 토큰보다 더 떨어진 행들: 첫 토큰 하나가 평균 {first:.1%}의 가중치를 받습니다"
            "(“어텐션 싱크”). 윈도우는 가중치의 {win:.1%}를 남기고, 윈도우에 첫 토큰을 전역 토큰으로 더하면 "
            "{lf:.1%}를 남깁니다. Z의 오차: {e_win:.3f} → {e_lf:.3f}.",
    "s_cost": "③ n에 따른 비용",
    "cost": "이 모델 모양의 무작위 q, k, v(쿼리 헤드 H = {H}, K/V 헤드 {H_kv}, d_k = {d}, float32)로 한 번 호출: "
            "시간(번갈아 {repeats}회 실행한 중앙값) · 호출이 할당한 최대 메모리(tracemalloc). 타일 {block}.",
    "col_method": "방법", "m_dense": "밀집 + 마스크", "m_tiled": "타일 (엔진)", "m_causal": "인과 (밀집)", "m_full": "전체 (밀집)",
    "m_window": "슬라이딩 윈도우", "m_dilated": "팽창 윈도우", "m_longformer": "Longformer", "m_bigbird": "BigBird",
    "m_block": "블록 희소",
    "cost_end": "밀집 + 마스크는 H·n²개의 점수를 들고, 마스크와 상관없이 n² 쌍을 모두 계산합니다. 타일 커널은 쿼리 "
                "블록마다 타일 몇 개만 들고 있어 메모리가 n에 비례해 늘고, 희소 패턴은 더 적은 타일을 계산합니다. "
                "더 큰 n: `qkv bench sparse`. 각 호출의 출력은 밀집 마스크 결과와 같습니다(확인함).",
    "fig_gallery": "희소 어텐션 마스크, n = {n}: 파란색 = 보이는 키, 회색 타일({block} × {block})은 건너뜀",
    "fig_kept": "쌍의 {d:.1%} · 타일 {T}개 중 {v}개 계산",
    "fig_key": "키 j", "fig_query": "쿼리 i",
    "fig_layer": "층",
    "fig_error": "{model}, n = {n}: 전체 어텐션 대비 Z의 오차",
    "fig_mass": "남은 모델 어텐션 가중치의 몫",
    "fig_mass_axis": "남은 A의 질량",
    "fig_time": "한 번 호출한 시간", "fig_memory": "한 번 호출의 최대 메모리 (tracemalloc)",
}

# qkv explain vit (lessons.vit)
VIT = {
    "title": "qkv explain vit · {model}",
    "intro": "비전 트랜스포머(ViT)는 이미지를 시퀀스로 읽습니다. 이미지를 패치로 자르고, 패치마다 토큰 벡터를 만든 뒤에는 "
             "텍스트 모델과 똑같은 블록을 지납니다(가이드: 블록). 답은 덧붙인 토큰 하나, [CLS]에서 읽습니다. 여기서 따라갈 "
             "것: {image}, 모델 {model}({h} × {w} 픽셀, {ph} × {pw} 패치가 {rows} × {cols}, L = {L}, H = {H}, "
             "d_model = {d}).",
    "example": "{name}({model}에 들어 있는 손글씨 숫자 예시)",

    "s_pixels": "① 픽셀로 본 이미지",
    "pixels": "모델이 읽는 그대로의 이미지입니다(크기가 다르면 먼저 {h} × {w}로 바꿉니다). 회색 값은 0(검정)부터 "
              "255(흰색)까지입니다. 왼쪽은 잉크로, 오른쪽은 숫자로:",
    "pixels_rgb": "모델이 읽는 그대로의 이미지입니다(크기가 다르면 먼저 {h} × {w}로 바꿉니다). 채널 {C}개: 그림은 "
                  "채널 평균으로, 숫자는 0번 채널로 보입니다. 0(어두움)부터 255(밝음)까지:",
    "pixels_big": "이미지는 {h} × {w} 픽셀입니다. 여기에는 왼쪽 위 {sh} × {sw}만 보입니다:",
    "normalise": "모델은 값 v를 x = (v/255 − {mean:g}) / {std:g}로 읽습니다. 흰색 255 → {white:+.2f}, "
                 "검정 0 → {black:+.2f}. pixel_values {shape}:",
    "normalise_check": "엔진의 pixel_values와 같습니다(최대 차이 {diff:.1e}).",

    "s_patches": "② {ph} × {pw} 패치로 자르기: {rows} × {cols} 격자",
    "patches": "패치 (r, c)는 {ph}·r … {ph}·r + {ph1}행, {pw}·c … {pw}·c + {pw1}열의 픽셀을 채널별로, 행 순서대로 "
               "읽은 C·{ph}·{pw} = {k}개의 수입니다. 패치 {P}개를 행 순서대로 늘어놓은 것이 이미지의 토큰입니다:",
    "patches_more": "… 그리고 패치 {more}개가 더 있습니다.",
    "col_patch": "패치", "col_rows": "행", "col_cols": "열", "col_values": "그 수들",
    "patches_check": "엔진이 자른 패치와 같습니다(qkv.inputs.images.patches_of, 최대 차이 {diff:.1e}).",

    "s_embed": "③ 패치가 토큰이 된다: X = [CLS; patches·W_patch + b_patch] + 위치",
    "embed": "텍스트 모델은 임베딩 표 E에서 행을 찾아오지만, ViT는 곱합니다. 토큰 = patch·W_patch + b_patch이고 "
             "W_patch는 {ws}이므로, 수 {k}개가 d_model = {d}개가 됩니다. 가장 어두운 패치는 {patch}입니다:",
    "conv": "체크포인트는 W_patch를 합성곱으로 저장합니다. {C} × {ph} × {pw} 필터 {d}개를 한 번에 {ph}행, {pw}열씩 "
            "옮기는 합성곱입니다. 창끼리 겹치지 않고 창 하나가 패치 하나를 보므로, 이 합성곱은 위의 곱과 같습니다. "
            "창을 하나씩 옮기며 계산해도 같은 {P} × {d} 토큰이 나옵니다(최대 차이 {diff:.1e}).",
    "cls": "패치 앞에는 [CLS]가 옵니다. 모든 이미지에 똑같은 학습된 벡터로, 다른 토큰을 읽어 답을 나르게 됩니다. "
           "그다음 위치마다 학습된 위치 표 {ps}의 행을 더합니다. 어텐션 자체는 집합만 보므로, 패치가 어디 있었는지는 "
           "위치 행이 알려 줍니다. X {xs}:",
    "row_cls": "[CLS] + P[0]", "row_patch": "{patch} + P[{i}]",
    "embed_check": "X는 0번 층으로 들어가는 엔진의 잔차 스트림과 같습니다(최대 차이 {diff:.1e}).",

    "s_attn": "④ 패치 위의 어텐션: {layer}번 층에서 [CLS]가 보는 곳",
    "attn": "여기서부터는 모든 텍스트 모델과 같은 어텐션입니다. 헤드마다 Q, K, V = Norm(X)·W + b, S = Q·Kᵀ/√d_k, "
            "A = softmax(S). A의 0번 행이 [CLS]가 보는 곳입니다. {rows} × {cols} 패치 격자 위에 헤드별로 각 패치의 "
            "가중치를 %로 놓았습니다([CLS]가 자기 자신에게 두는 몫은 나머지입니다):",
    "head_grid": "헤드 {head} ([CLS] {own:.0%})",
    "head_row": "{head}번 헤드는 한 패치에 가장 많이 둡니다: {patch}에 {w:.0%}. 이 헤드의 [CLS] 행을 계산하면 "
                "s_j = q_[CLS]·k_j / √{d_k}, 그다음 softmax입니다. 큰 것 {top}개:",
    "col_key": "키", "col_score": "점수 s_j", "col_exp": "exp(s_j − max s)", "col_weight": "가중치 a_j",
    "attn_sum": "지수 {n}개의 합은 {total:.4f}입니다. 가중치는 각 지수를 이 합으로 나눈 값이므로 행의 합은 "
                "{one:.6f}입니다.",
    "attn_check": "{layer}번 층 헤드 {H}개의 점수와 가중치를 가중치 행렬로 다시 계산하면 엔진의 값과 같습니다"
                  "(최대 차이: 점수 {ds:.1e}, 가중치 {da:.1e}).",

    "s_rollout": "⑤ 어텐션 롤아웃: {L}개 층을 지나 [CLS]에 닿는 것",
    "rollout": "층 하나의 어텐션은 한 걸음일 뿐이고, [CLS]는 {L}개 층을 지난 뒤에 읽습니다. 롤아웃(Abnar & Zuidema "
               "2020)은 층들을 곱합니다. Â = ½·mean_h A + ½·I(잔차 연결을 자기 자신에 대한 어텐션으로 봄), "
               "R = Â_{L} ⋯ Â_1. 패치 위에 놓은 R의 0번 행은 각 패치가 [CLS]에 얼마나 닿는지입니다(%, [CLS] "
               "자신: {own:.0%}):",
    "rollout_end": "가장 많이 닿는 것은 {patch}({w:.0%})입니다. qkv의 attention_rollout(qkv.analysis.rollout)과 "
                   "같습니다(최대 차이 {diff:.1e}).",

    "s_classify": "⑥ 답: 분류기가 [CLS]를 읽는다",
    "classify": "{L}개 블록 뒤에 마지막 LayerNorm이 오고, 그다음에는 0번 행만 읽습니다. logits = "
                "Norm(x_[CLS])·W_vocab + b_vocab이고 W_vocab은 {ws}: 레이블마다 점수 하나입니다. softmax가 점수를 "
                "확률로 바꿉니다:",
    "col_label": "레이블", "col_logit": "로짓", "col_prob": "확률",
    "classify_end": "{model}의 답은 {label}입니다({p:.1%}).",
    "classify_true": "{model}의 답은 {label}입니다({p:.1%}). 이 예시는 손으로 쓴 {true}입니다.",
    "classify_check": "전체 계산을 가중치로부터 여기서 float64로 다시 했습니다(블록마다 LayerNorm, 어텐션, W_O, "
                      "{act} FFN). 모든 층으로 들어가는 잔차 스트림이 엔진의 것과 같고(최대 차이 {dr:.1e}), 로짓은 "
                      "엔진의 trace.logits[0]과 같습니다(최대 차이 {dl:.1e}).",

    "fig_image": "{image}: 패치 {rows} × {cols}", "fig_head": "{layer}번 층, 헤드 {head}: [CLS] → 패치",
    "fig_rollout": "{L}개 층의 롤아웃: 패치 → [CLS]", "fig_probs": "로짓의 softmax",
    "fig_title": "{model}: [CLS] 뒤에 패치 토큰 {P}개로 놓인 이미지",
}

# 어트리뷰션 그래프 페이지 (`graphs.page`, assets/graph.js)와 `qkv serve`의 그래프 탭
GRAPH = {
    "title": "어트리뷰션 그래프 · {model}",
    "prompt": "프롬프트", "target": "목표", "none": "없음",
    "lang": "English",
    "mode_subgraph": "부분 그래프 남기기", "mode_select": "선택", "mode_path": "경로 고정",
    "hint_subgraph": "노드 위에 마우스를 올리면 카드가 보입니다. 노드를 누르면 그 조상과 자손만 남고, 빈 곳을 누르면 "
                     "모든 노드가 다시 보입니다.",
    "hint_select": "노드를 눌러 선택하고(Shift+클릭은 어느 모드에서나 됩니다) 이름을 붙인 뒤 묶기를 누르세요. 그 노드들이 "
                   "슈퍼노드 하나가 되고 엣지는 합쳐집니다.",
    "hint_path": "노드를 누르면 그 노드를 지나는 가장 강한 경로가 고정됩니다. 아래로는 가장 강한 들어오는 엣지를, "
                 "위로는 가장 강한 나가는 엣지를 한 단계씩 따라갑니다(|가중치| 기준).",
    "show_all": "모두 보기", "kept": "노드 {total}개 중 {count}개 남김",
    "group": "묶기", "group_name": "슈퍼노드 이름", "ungroup": "풀기", "supernodes": "슈퍼노드",
    "selected": "{count}개 선택됨", "need_two": "먼저 노드를 두 개 이상 선택하세요.",
    "default_group": "묶음 {n}",
    "path": "고정된 경로", "clear_path": "경로 지우기", "no_path": "“경로 고정” 모드에서 노드를 누르면 경로가 고정됩니다.",
    "scores": "점수", "unpruned": "그래프", "pruned": "가지치기 후",
    "replacement": "대체 점수", "completeness": "완전성 점수", "not_computed": "—",
    "thresholds": "노드 임계값 {node}, 엣지 임계값 {edge}로 가지치기함",
    "counts": "노드 {nodes}개(피처 {features}개, 오차 노드 {errors}개, 로짓 {logits}개), 엣지 {links}개를 그림",
    "dropped": "그래프의 엣지 {total}개 중 가장 강한 {shown}개를 그립니다.",
    "kind_embedding": "임베딩", "kind_feature": "피처", "kind_error": "오차", "kind_logit": "로짓",
    "kind_super": "슈퍼노드",
    "layer": "층", "row_embedding": "임베딩", "row_logit": "로짓",
    "card_empty": "노드 위에 마우스를 올리면 무엇인지 보입니다.",
    "card_feature": "피처 {feature} · {layer}번 층 · 위치 {position} (“{token}”)",
    "card_embedding": "“{token}”의 임베딩 · 위치 {position}",
    "card_error": "오차 노드 · {layer}번 층 · 위치 {position} (“{token}”): 트랜스코더가 놓친 부분",
    "card_logit": "“{token}”의 로짓 (id {id}) · p = {p}",
    "card_super": "슈퍼노드 “{name}” · 노드 {count}개",
    "activation": "활성값", "influence": "영향력", "norm": "노름", "logit": "로짓",
    "promotes": "올리는 토큰", "suppresses": "내리는 토큰", "contexts": "가장 강하게 활성화된 문맥",
    "no_annotation": "이 피처에는 주석이 없습니다. 코퍼스로 그래프에 주석을 달면 문맥이 보입니다.",
    "inputs": "가장 강한 입력", "outputs": "가장 강한 출력",
    "legend": "엣지 굵기 ∝ |가중치|: 빨강은 목표를 키우고 파랑은 줄입니다. 행은 층(아래가 임베딩, 위가 로짓), "
              "열은 위치입니다.",
    "export": "내보내기", "saved": "{name} 저장함",
    "open": "그래프 JSON(qkv graph … --json FILE)을 열거나 여기에 끌어다 놓으세요",
    "compute": "이 프롬프트의 그래프", "computing": "그래프를 계산하는 중입니다(노드 묶음마다 역전파 한 번) …",
    "bad_file": "이 파일은 qkv가 그릴 수 있는 그래프가 아닙니다: {why}",
}

# qkv explain circuits (graphs.lesson)
CIRCUITS = {
    "title": "qkv explain circuits · {model} · 레이어 {layer} / {L} · “{token}”",
    "intro": "어트리뷰션 그래프는 예측 하나를 회로로 설명합니다. 각 FFN을 트랜스코더(읽을 수 있는 희소 특징)로 바꿔 쓰고, "
             "어텐션 패턴과 정규화 배율은 실제 패스의 값으로 고정합니다. 그러면 남는 것은 선형이어서, 모든 엣지(한 노드가 "
             "다른 노드에 주는 직접 효과)가 정확합니다. 작은 그래프 하나를 한 단계씩 따라갑니다.",
    "s_box": "① 레이어 {layer}, “{token}”의 FFN 상자와 트랜스코더",
    "box": "FFN은 h(정규화 뒤, d_model = {d_model})를 읽고 y(스트림에 더해지는 값)를 씁니다. 트랜스코더는 같은 상자를 "
           "바꿔 쓴 것입니다. h를 읽어 {d_sae}개 특징 중 몇 개만 남기고({arch}), z = act(h·W_enc + b_enc), "
           "ŷ = z·W_dec + b_dec를 씁니다.",
    "box_plain": "켜진 특징 f는 각각 z_f·W_dec[f]를 더합니다. FFN이 쓰는 것의 읽을 수 있는 한 조각입니다.",
    "box_skip": "이 트랜스코더에는 선형 스킵도 있습니다: ŷ = z·W_dec + b_dec + h·W_skip.",
    "box_error": "놓친 부분이 오차 e = y − ŷ입니다: ‖e‖/‖y‖ = {rel:.3f} (‖y‖²의 {fvu:.3f}). 그래프는 e를 오차 노드로 "
                 "남겨 FFN이 쓴 것을 하나도 잃지 않습니다.",
    "box_check": "검증: y를 FFN 가중치로 float64에서 다시 계산(차이 {ffn:.1e}), z와 ŷ를 float64로 다시 계산"
                 "({recon:.1e}), ŷ + e = y ({sum:.1e}).",
    "s_features": "② 여기서 켜진 특징",
    "features": "이 토큰에서 {d_sae}개 중 {n}개 특징이 켜집니다. 상위 {top}개와, 각 디코더 행 W_dec[f]가 올리는 토큰"
                "(로짓 렌즈처럼 마지막 정규화의 γ와 W_vocab을 거쳐 읽음):",
    "col_feature": "특징", "col_z": "활성값 z", "col_promoted": "올리는 토큰",
    "features_end": "검증: 그 행들의 로짓을 W_vocab으로 float64에서 모두 다시 계산했습니다.",
    "s_replacement": "③ 국소 대체 모델",
    "replacement_model": "모든 어텐션 패턴과 정규화 배율을 실제 패스의 값으로 고정하고, 각 FFN을 트랜스코더와 그 오차로 "
                         "바꿉니다. 이 프롬프트에서는 모델과 같고, 노드에서 로짓까지의 모든 경로가 선형 사상의 곱입니다.",
    "replacement_check": "그 로짓과 모델의 로짓: 가장 큰 차이는 {diff:.1e}. 다음 토큰 1위는 {token} (p = {prob:.3f}).",
    "s_edge": "④ {token}의 로짓으로 들어가는 엣지 하나",
    "edge_target": "로짓 노드의 입력은 로짓 − 평균 로짓 = {value:+.4f}이고, {n}개 노드가 직접 엣지로 이어집니다.",
    "edge_strongest": "가장 강한 것: {source}, 들어오는 |엣지|의 {share:.1%}.",
    "edge_feature": "특징에서 오는 것 중 가장 강한 것: {source}, 들어오는 |엣지|의 {share:.1%}.",
    "src_feature": "레이어 {layer}, 위치 {pos}(“{token}”)의 특징 {f}",
    "src_error": "레이어 {layer}, 위치 {pos}(“{token}”)의 오차 노드",
    "src_embedding": "위치 {pos}(“{token}”)의 임베딩",
    "edge_means": "엣지는 소스의 값 × 소스가 쓰는 자리에서 본 타깃 입력의 기울기입니다. 고정된 시스템만 거치므로(다른 "
                  "특징은 반응하지 않음) 직접 효과입니다.",
    "edge_held": "다른 방법으로 검증: 모든 FFN 출력을 고정하고 이 소스의 벡터만 빼서 고정 패스를 돌리면 입력이 "
                 "{moved:+.4f}만큼 움직이므로 엣지는 {held:+.4f}입니다(차이 {diff:.1e}).",
    "edge_sum": "들어오는 엣지의 합은 {edges:+.4f}, 상수 {const:+.4f}(어느 엣지도 나르지 않는 편향)를 더하면 {total:+.4f}, "
                "곧 입력 {value:+.4f}입니다(차이 {diff:.1e}).",
    "error_nodes": "오차 노드가 있는 것은 트랜스코더가 정확하지 않기 때문입니다. 각각은 특징이 설명하지 못하는 상수 "
                   "벡터입니다. 이것이 없으면 대체 모델이 모델의 로짓을 내지 못하고, 엣지의 합도 맞지 않습니다.",
    "s_scores": "⑤ 특징이 그래프를 얼마나 설명하나",
    "nodes": "그래프: 특징 노드 {features}개, 오차 노드 {errors}개, 임베딩 {embeddings}개, 로짓 {logits}개.",
    "score_replacement": "replacement = {v:.3f}: 로짓에 닿는 영향 중 오차 노드가 아니라 토큰에서 시작하는 몫.",
    "score_completeness": "completeness = {v:.3f}: 각 노드의 입력을 영향으로 가중했을 때, 오차가 아니라 노드에서 오는 몫.",
    "scores_check": "검증: 둘 다 레이어별로 float64에서 다시 계산했습니다(차이 {diff:.1e}).",
    "next": "가지치기한 전체 그래프와 그 페이지: qkv graph TEXT --transcoders DIR --page graph.html",
}

# qkv explain patching (lessons.patching)
PATCHING = {
    "title": "qkv explain patching · {model}",
    "intro": "답을 실어 나르는 헤드는 어느 것일까요? 프롬프트 한 쌍으로 세 가지 방법을 써 봅니다. 정확한 활성값 패칭(헤드 "
             "하나의 출력을 바꿔 넣고 모델을 다시 실행), 어트리뷰션 패칭(AtP: 같은 교체를 기울기로 어림해 모든 헤드를 한 "
             "번에), 경로 패칭(그 교체를 한 경로로만 보냄). 헤드 하나를 세 방법으로 따라갑니다.",
    "clean": "깨끗한", "corrupted": "오염된",
    "s_metric": "① 지표",
    "pair": "깨끗한 프롬프트: {clean!r}. 오염된 프롬프트: {corrupted!r}. 둘 다 토큰 {n}개이므로 한쪽의 위치 p가 "
            "다른 쪽의 위치 p와 맞습니다.",
    "metric": "m = logit({answer}) − logit({wrong}), 마지막 위치에서: 모델이 오염된 쪽 답보다 깨끗한 쪽 답을 얼마나 더 "
              "기대하는지입니다.",
    "col_prompt": "프롬프트",
    "metric_check": "검증: 전체 순전파의 로짓으로 계산한 m이 패칭이 계산한 값과 같습니다(차이 {diff:.1e}).",
    "s_exact": "② 헤드 {layer}.{head}의 정확한 패칭",
    "exact": "오염된 프롬프트를 다시 실행하되, 헤드 {layer}.{head}의 출력 Z = A·V(모든 위치)를 깨끗한 실행에서 복사해 "
             "넣습니다. 그 뒤는 모두 다시 계산합니다.",
    "exact_auto": "{L} × {H}개 헤드 중(뒤쪽 헤드로 보낼 곳이 없는 마지막 레이어는 빼고) 패치했을 때 m을 가장 많이 "
                  "움직이는 헤드를 골랐습니다.",
    "exact_means": "0이면 이 헤드가 차이를 전혀 나르지 않는다는 뜻이고, 1이면 이 헤드 하나로 깨끗한 답이 완전히 "
                   "돌아온다는 뜻입니다. 이 헤드는 {exact:.1%}를 되돌립니다.",
    "exact_check": "검증: 이 헤드의 Z에 훅을 건 전체 순전파가 patch 표의 값과 같은 수를 줍니다(차이 {diff:.1e}).",
    "s_atp": "③ 헤드 {layer}.{head}의 어트리뷰션 패칭(AtP)",
    "atp": "정확한 패칭은 헤드마다 한 번씩 다시 실행해야 합니다. AtP는 순전파 두 번과 역전파 한 번으로 모든 헤드를 "
           "어림합니다: m(패치) − m(오염) ≈ (a_clean − a_corrupted)·∂m/∂a, 기울기는 오염된 실행에서 구합니다. 여기서 "
           "a는 헤드의 Z(위치 {n}개 × d_k = {d_k})이고, 위치 {moved}곳에서 바뀝니다(‖Δa‖ = {norm:.4f}). 내적은 위치에 "
           "대한 합이고, 가장 큰 항들은:",
    "col_position": "위치", "col_token": "토큰",
    "others": "나머지 {k}개",
    "atp_check": "검증: 각 항을 역전파 없이 측정했습니다(Δa_p 방향으로 ±ε만큼 움직인 중앙 차분). 그 합을 나눈 값이 "
                 "atp 표의 값과 같습니다(차이 {diff:.1e}).",
    "line": "왜 정확한 값 {exact:+.4f} 대신 {estimate:+.4f}일까요? AtP는 오염된 실행에서의 기울기로 직선을 긋습니다. "
            "Z_corrupted에서 Z_clean까지 가는 길(Z_corrupted + t·ΔZ)에서 실제 m은 휘어집니다. 뒤따르는 어텐션과 "
            "마지막 정규화가 선형이 아니기 때문입니다.",
    "col_m_real": "m (실제)", "col_m_line": "m (AtP의 직선)",
    "line_check": "검증: t = 0은 오염된 실행, t = 1은 ②의 패치된 실행입니다(차이 {diff:.1e}).",
    "table": "헤드 {cells}개 전체에서 AtP와 정확한 값: 피어슨 r = {r:.3f}, 부호가 같은 비율 {sign:.0%}, 정확한 값의 "
             "절반보다 더 틀린 헤드 {off}개. AtP로 헤드 순위를 싸게 매기고, 높은 순위의 헤드는 정확하게 다시 패치합니다.",
    "table_check": "검증: r과 부호 비율을 공식대로 다시 계산했습니다(차이 {diff:.1e}).",
    "s_path": "④ 경로 패칭: 헤드 {layer}.{head} → 헤드 {rl}.{rh}의 쿼리",
    "path": "헤드를 패치하면 그 뒤의 모든 것이 바뀝니다. 경로 패칭은 한 경로만 묻습니다: 잔차 스트림을 거쳐 헤드 "
            "{layer}.{head}에서 헤드 {rl}.{rh}의 쿼리로 곧장 가는 것(뒤쪽 헤드들의 쿼리 가운데 이 경로가 m을 가장 많이 "
            "움직이는 곳). "
            "Wang 외(2022)처럼 방향은 반대입니다: 오염된 출력을 깨끗한 실행에 넣습니다.",
    "path_frozen": "깨끗한 실행 값으로 고정: 다른 모든 헤드와 FFN, 그리고 {rl}.{rh}의 키와 값. 바뀌는 것: {rl}.{rh}의 "
                   "쿼리 입력 x_clean + Δ, 여기서 Δ는 {layer}.{head}의 오염된 Z가 그 레이어의 출력을 바꾸는 양. 다시 "
                   "계산: {rl}.{rh}의 패턴과 출력, 그리고 그 뒤의 모든 것.",
    "path_whole": "이 방향으로 본 헤드 {layer}.{head}의 전체 효과(깨끗한 실행에 오염된 Z, 모든 경로)는 {noising:+.4f}이고, "
                  "이 경로 하나만으로는 {path:+.4f}입니다. 한 헤드의 경로들을 더한다고 전체 효과가 되지는 않으며, 어떤 경로는 "
                  "오히려 반대쪽으로 밀기도 합니다.",
    "path_check": "검증: 손으로 한 경로 패칭(훅을 건 패스로 Δ, x_clean + Δ 위의 패스로 {rl}.{rh}의 쿼리, 그 쿼리를 훅으로 "
                  "깨끗한 패스에 넣음)이 path_patch의 값, 그리고 뒤쪽 헤드 전체에 대한 표의 해당 칸과 같고, 전체 효과는 "
                  "patch_one의 값과 같습니다(차이 {diff:.1e}).",
    "s_side": "⑤ 나란히 보기",
    "col_method": "방법", "col_number": "효과", "col_answers": "답하는 질문",
    "m_exact": "정확한 패칭", "m_atp": "AtP", "m_path": "경로 패칭",
    "m_noise": "헤드 오염",
    "a_exact": "헤드 {layer}.{head} 하나가 오염된 실행에 깨끗한 답을 얼마나 되돌리나",
    "a_atp": "같은 질문의 1차 어림: 모든 헤드를 한 번에 싸게, m이 휘는 곳에서는 틀림",
    "a_path": "답 가운데 이 헤드에서 헤드 {rl}.{rh}의 쿼리로 흐르는 몫",
    "a_noise": "이 헤드 하나만 오염시키면 답이 얼마나 떨어지나(모든 경로)",
    "side": "모든 효과는 m(깨끗) − m(오염)에 대한 비율입니다. +는 깨끗한 쪽 답으로, −는 오염된 쪽 답으로 움직인 "
            "것입니다. 정확한 패칭과 AtP는 깨끗한 헤드를 오염된 실행에 넣고, 경로 패칭과 헤드 오염은 오염된 헤드를 "
            "깨끗한 실행에 넣습니다. 그래서 뒤쪽 둘에서는 답을 나르는 헤드가 −로 나타납니다.",
    "next": "표 전체: qkv patch, qkv atp, qkv path-patch (각각 --json과 --out).",
    "fig_exact": "정확한 패칭", "fig_atp": "AtP", "fig_scatter": "{model}: 헤드 {cells}개, r = {r:.3f}",
    "fig_real": "m (실제)", "fig_linear": "AtP의 직선", "fig_t": "t (Z_corrupted + t·ΔZ)",
    "fig_line": "헤드 {layer}.{head}: 오염(t = 0)에서 깨끗(t = 1)까지",
}

LINEAR = {
    "title": "qkv explain linear · {model}",
    "intro": "소프트맥스 어텐션은 n × n 행렬 A = softmax(Q·Kᵀ/√d_k + M)를 만든 뒤 A·V를 읽습니다: 비용과 메모리가 n²로 늘어납니다. 선형 어텐션은 소프트맥스 대신 "
             "특징의 곱 A[t, s] ∝ φ(qₜ)·φ(kₛ)를 쓰므로 (φ(Q)·φ(K)ᵀ)·V를 φ(Q)·(φ(K)ᵀ·V)로 묶을 수 있습니다: n × n 행렬은 만들지 않고, 글을 따라 "
             "d_k × d_v 상태 S = Σₛ φ(kₛ)·vₛᵀ를 들고 가며 각 토큰의 출력을 φ(qₜ)·S로 읽습니다.",
    "s_matrix": "① 만들지 않는 행렬: 레이어 {layer}, 헤드 {head}",
    "matrix_kernel": "{model}은(는) 소프트맥스 모델입니다. {text!r}({n}개 토큰)을 읽는 레이어 {layer} 헤드 {head}의 q, k, v를 φ(x) = elu(x) "
                     "+ 1(Katharopoulos 외 2020)에 통과시켜: s ≤ t에서 A[t, s] = φ(qₜ)·φ(kₛ), 각 행은 그 합으로 나눕니다(앞쪽 행과 열):",
    "matrix_lightning": "{model}의 레이어 {layer}는 라이트닝 어텐션(MiniMax)입니다: 소프트맥스도, RoPE도, 1/√d_k도 없고 헤드 {head}의 출력은 oₜ = "
                        "Σ_(s ≤ t) (qₜ·kₛ)·λ^(t−s)·vₛ, 헤드마다 고정된 감쇠 λ입니다. {text!r}({n}개 토큰)에서 이것이 뜻하는 행렬 A[t, s] = "
                        "(qₜ·kₛ)·λ^(t−s)(앞쪽 행과 열; 부호가 있고 행의 합은 1이 아닙니다):",
    "matrix_mamba": "{model}의 레이어 {layer}는 선택적 스캔(Mamba)입니다: 채널 {head}의 출력은 yₜ = Σ_(s ≤ t) α[t, s]·x̃ₛ, α[t, s] = "
                    "Cₜ·(Π exp(Δᵣ·A))·Bₛ·Δₛ(Ali 외 2024), 그 채널의 행렬입니다. {text!r}({n}개 토큰)에서 앞쪽 행과 열:",
    "matrix_delta": "{model}의 레이어 {layer}는 게이트 델타 레이어(Qwen3-Next)입니다: 값 헤드 {head}의 상태는 토큰마다 다시 쓰여, Sₜ = exp(gₜ)·(I "
                    "− βₜ·k̂ₜk̂ₜᵀ)·Sₜ₋₁ + βₜ·k̂ₜ·vₜᵀ, oₜ = Sₜᵀ·q̂ₜ로 읽힙니다. 펼치면 oₜ = Σ_(s ≤ t) A[t, s]·vₛ, A[t, s] = "
                    "q̂ₜᵀ·Uₜ[:, s], 키 Uₜ = [exp(gₜ)·(I − βₜ·k̂ₜk̂ₜᵀ)·Uₜ₋₁ | βₜ·k̂ₜ]입니다. {text!r}({n}개 토큰)에서 앞쪽 행과 "
                    "열:",
    "softmax_beside": "옆에, 같은 헤드의 모델 자신의 소프트맥스 가중치:",
    "check_kernel": "확인: A·V는 A를 만들지 않는 qkv.core.kernels.linear_attention과 같습니다(최대 차이 {diff_matrix:.1e}); 모델의 "
                    "소프트맥스 가중치 곱하기 V는 그 헤드의 출력입니다({diff_output:.1e}).",
    "check_lightning": "확인: 이 행렬은 모델이 레이어의 점수(scores)로 기록하는 것과 같고({diff_matrix:.1e}; 보기가 그리는 어텐션은 그 |A|를 행마다 몫으로 "
                       "나눈 것), A·V는 모델이 A를 만들지 않고 상태로 블록마다 더하는 그 헤드의 출력입니다({diff_output:.1e}).",
    "check_mamba": "확인: α는 엔진의 블록 형태와 같고({diff_matrix:.1e}), α·x̃는 모델이 상태로 한 걸음씩 계산하는 스캔의 "
                   "출력입니다({diff_output:.1e}).",
    "check_delta": "확인: 여기서 키 Uₜ로 다시 계산한 행렬은 엔진의 암묵적 어텐션과 같고({diff_matrix:.1e}), A·V는 모델이 상태로 한 걸음씩 계산하는 델타 규칙의 "
                   "출력입니다({diff_output:.1e}).",
    "s_state": "② 대신 들고 가는 상태",
    "state_kernel": "{n}개 토큰 뒤의 상태는 S = Σₛ φ(kₛ)·vₛᵀ, {d_k} × {d_v} 행렬이고 z = Σₛ φ(kₛ)는 행의 합입니다: n과 상관없이 헤드마다 "
                    "{dd}개의 수, n × n 행렬의 {nn}개와 비교해(n = {cross}부터 더 작음; 8,192 토큰이면 A는 67,108,864개). 마지막 토큰의 출력 "
                    "φ(q)·S / φ(q)·z는 A·V의 마지막 행과 같습니다(최대 차이 {diff_row:.1e}).",
    "state_lightning": "{n}개 토큰 뒤의 상태는 S = Σₛ λ^(n−1−s)·kₛᵀ·vₛ, {d_k} × {d_v} 행렬입니다: n과 상관없이 헤드마다 {dd}개의 수, n × n "
                       "행렬의 {nn}개와 비교해(n = {cross}부터 더 작음). 새 토큰 하나는 S ← λ·S + kᵀ·v와 o = q·S로 끝납니다. 마지막 토큰의 q·S는 "
                       "A·V의 마지막 행과 같습니다(최대 차이 {diff_row:.1e}).",
    "state_mamba": "{n}개 토큰 뒤 채널의 상태는 h, n과 상관없이 {d_k}개의 수(Mamba의 d_state)로, n × n 행렬의 {nn}개와 비교됩니다: 새 토큰 하나는 h ← "
                   "exp(Δ·A)⊙h + Δ·x̃·B와 y = h·C로 끝납니다. 마지막 토큰의 h·C는 α·x̃의 마지막 행과 같습니다(최대 차이 {diff_row:.1e}).",
    "state_delta": "{n}개 토큰 뒤의 상태는 S, {d_k} × {d_v} 행렬입니다: n과 상관없이 값 헤드마다 {dd}개의 수, n × n 행렬의 {nn}개와 비교해(n = "
                   "{cross}부터 더 작음). 마지막 토큰의 Sᵀ·q̂는 A·V의 마지막 행과 같습니다(최대 차이 {diff_row:.1e}).",
    "state_cache": "이것은 글을 읽은 뒤 모델 자신의 캐시가 이 레이어에 대해 들고 있는 상태입니다(최대 차이 {diff:.1e}): 생성할 때 지나간 모든 K와 V가 아니라 S를 "
                   "저장합니다.",
    "s_decay": "③ 헤드마다 얼마나 멀리 기억하나",
    "decay": "헤드마다의 λ(MiniMax의 기울기, ALiBi의 것, 깊이에 따라 약해짐): 키의 가중치는 쿼리와의 사이 토큰 하나마다 λ가 곱해지므로, 마지막 열의 토큰 수만큼 지나면 절반이 "
             "됩니다.",
    "col_head": "헤드",
    "col_decay": "λ",
    "col_half": "절반이 되는 토큰 수",
    "s_compare": "③ 선형은 소프트맥스와 얼마나 다른가, 모든 레이어",
    "compare": "{model}의 모든 레이어 모든 헤드에서, 소프트맥스 대신 자기 q, k, v를 φ에 통과시켜, qkv bench --linear가 재는 대로: 헤드 출력의 상대 오차 "
               "‖linear − softmax‖ / ‖softmax‖와 코사인, 헤드 평균:",
    "col_layer": "레이어",
    "col_rel": "상대 오차",
    "col_cos": "코사인",
    "compare_end": "가장 나쁜 것은 레이어 {layer}({rel:.2f})입니다: 소프트맥스로 학습한 모델은 키를 선형 커널처럼 읽지 않습니다. 선형 어텐션으로 만든 모델은 q, k, "
                   "v를 그에 맞게 학습합니다: --model에 MiniMax나 Mamba 체크포인트를 주어 보세요.",
    "end_kernel": "선형 어텐션은 소프트맥스의 날카로운 선택을, 글이 길어져도 커지지 않는 상태와 맞바꿉니다.",
    "end_lightning": "MiniMax는 라이트닝 레이어 사이에 소프트맥스 레이어를 몇 개 둡니다: 그것들은 과거를 정확히, 라이트닝 레이어는 싸게 읽습니다.",
    "end_delta": "델타 규칙은 각 값을 상태가 그 키에서 이미 들고 있던 것 위에 덮어씁니다(I − β·k̂k̂ᵀ): 더하기만 하지 않고 고쳐 쓸 수 있는 선형 어텐션입니다.",
    "end_mamba": "Mamba 레이어는 감쇠를 토큰마다(Δ), 채널마다 고르는 선형 어텐션입니다.",
    "fig_linear": "선형: 레이어 {layer}, 헤드 {head}",
    "fig_softmax": "소프트맥스: 레이어 {layer}, 헤드 {head}",
    "fig_state": "상태 ({d_k} × {d_v})",
    "fig_title": "{model}: 만들지 않는 행렬과 들고 가는 상태({n}개 토큰)",
}


PROTEINS = {
    "title": "qkv explain proteins · {model}",
    "intro": "단백질은 아미노산 사슬이 3차원으로 접힌 것이라, 사슬에서 멀리 떨어진 잔기끼리도 맞닿을 수 있습니다. 단백질 언어 "
             "모델(ESM-2)은 서열만 보고 가려진 잔기를 맞히도록 학습합니다. 맞닿은 잔기들은 진화 과정에서 함께 바뀌므로(한쪽의 "
             "변이를 다른 쪽이 보완), 가려진 잔기를 맞히려면 접촉 상대를 보는 헤드가 유리합니다. 그런 헤드의 어텐션 지도가 곧 "
             "접촉 지도입니다. Rao 등(2020)이 이를 보였습니다: 모든 헤드의 대칭화·APC 보정 지도에 로지스틱 회귀를 얹어, 구조를 "
             "아는 단백질 몇 개로 맞추면 많은 유사 서열 정렬에 기반한 방법만큼 접촉을 예측합니다.",
    "s_sequence": "① 서열",
    "trp_cage": "기본 예시는 스스로 접히는 {m}잔기 미니단백질 Trp-cage(TC5b, PDB 1L2Y)입니다:",
    "sequence": "주어진 서열({m}잔기):",
    "s_steps": "② 어텐션에서 접촉으로",
    "steps": "모델은 <cls>, 잔기들, <eos>를 읽습니다: n = {n}개 토큰. 모든 층의 어텐션을 모읍니다: {L}개 층 × {H}개 헤드 = "
             "{n} × {n} 지도 {LH}장. <cls>와 <eos>를 빼고({m} × {m}), 각 지도를 대칭화하고(A + Aᵀ: 접촉에는 방향이 "
             "없음) 평균곱 보정합니다. F = X − (행 합)(열 합)/전체 합으로, 잔기 하나의 전반적인 끌림이 설명하는 몫을 "
             "덜어 냅니다(APC, 공진화 방법에서 온 보정). 그다음 {LH}개 헤드에 걸쳐 P[i, j] = σ(Σ_c w_c·F_c[i, j] + b). "
             "가장 큰 가중치: {named}; b = {b:+.3f}.",
    "checked": "여기서 헤드마다 다시 계산했습니다: 모든 F가 엔진 값과 {diff_features:.1e} 안에서, 지도 P가 {diff_map:.1e} "
               "안에서 같습니다(transformers의 EsmModel.predict_contacts와 같은 단계). APC대로 모든 F의 합은 "
               "0입니다({diff_total:.1e}).",
    "s_map": "③ 접촉 지도와 가장 잘 맞는 헤드",
    "map": "P를 대각선 밖의 최솟값({lo:.3f})부터 최댓값({hi:.3f})까지 음영으로({shades}); 오른쪽은 P와 가장 잘 맞는 "
           "헤드 하나의 지도입니다.",
    "map_title": "P (접촉 헤드)",
    "best_title": "헤드 {layer}.{head} (r = {r:+.3f})",
    "top": "사슬에서 {separation}칸 이상 떨어진 쌍 가운데 모델이 가장 확신하는 쌍:",
    "col_pair": "쌍",
    "col_residues": "잔기",
    "col_p": "P",
    "s_heads": "④ 접촉을 그리는 헤드",
    "heads": "{separation}칸 이상 떨어진 쌍에서 각 헤드의 F와 P의 피어슨 r(가장 좋은 헤드의 r은 np.corrcoef로 확인: "
             "{diff_r:.1e}):",
    "col_head": "헤드",
    "col_r": "r",
    "col_w": "가중치 w",
    "noise": "무작위이거나 학습되지 않은 모델이면 지도는 잡음입니다. 계산 자체는 ESM-2가 하는 그대로입니다.",
    "end": "구조는 주지 않았습니다: 접촉은 서열에서 배운 어텐션만으로 나옵니다.",
    "fig_map": "예측한 접촉 P",
    "fig_head": "헤드 {layer}.{head}: APC(A + Aᵀ), r = {r:+.2f}",
    "fig_title": "{model}: 어텐션에서 나온 접촉({m}잔기)",
}


PAGES = {"explain": EXPLAIN, "pipeline": PIPELINE, "ffn": FFN, "flash": FLASH, "gqa": GQA, "kvcache": KVCACHE,
         "positions": POSITIONS, "sparse": SPARSE, "vit": VIT, "graph": GRAPH, "circuits": CIRCUITS,
         "patching": PATCHING, "linear": LINEAR, "proteins": PROTEINS}
