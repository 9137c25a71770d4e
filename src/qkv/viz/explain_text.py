"""The sentences of `qkv explain`, in English and in Korean (the words of docs/guide.md and docs/guide.ko.md).

Each entry is a `str.format` template; `explain.py` fills in the numbers it computed from
the real model. Both languages have exactly the same keys (a test checks it).
"""

from __future__ import annotations

EN = {
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

KO = {
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

TEXTS = {"en": EN, "ko": KO}
