"""The sentences of `qkv explain kv-cache`, in English and Korean (the same keys in both)."""

from __future__ import annotations

EN = {
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

    "fig_full": "without the cache", "fig_cache": "with the cache", "fig_m": "tokens so far m",
    "fig_time": "time of a step (measured)", "fig_flops": "FLOPs of a step (counted)", "fig_tokens": "tokens",
    "fig_memory": "{model}: KV cache, float32",
}

KO = {
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

    "fig_full": "캐시 없음", "fig_cache": "캐시 있음", "fig_m": "지금까지의 토큰 수 m",
    "fig_time": "한 단계의 시간(측정)", "fig_flops": "한 단계의 FLOPs(계산)", "fig_tokens": "토큰 수",
    "fig_memory": "{model}: KV 캐시, float32",
}

TEXTS = {"en": EN, "ko": KO}
