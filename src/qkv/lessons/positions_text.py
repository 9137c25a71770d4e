"""The sentences of `qkv explain positions`, in English and Korean (the same keys in both)."""

from __future__ import annotations

EN = {
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

KO = {
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

TEXTS = {"en": EN, "ko": KO}
