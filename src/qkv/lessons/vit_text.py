"""The sentences of `qkv explain vit`, in English and Korean (the same keys in both)."""

from __future__ import annotations

EN = {
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

KO = {
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

TEXTS = {"en": EN, "ko": KO}
