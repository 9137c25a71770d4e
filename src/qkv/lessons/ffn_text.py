"""The sentences of `qkv explain ffn`, in English and Korean (the same keys in both; a test checks it)."""

from __future__ import annotations

EN = {
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
    "s_in_gated": "② Up to d_ff: u = h·W_in and the gate g = h·W_gate",
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

KO = {
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
    "s_in_gated": "② d_ff로 넓히기: u = h·W_in, 게이트 g = h·W_gate",
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

TEXTS = {"en": EN, "ko": KO}
