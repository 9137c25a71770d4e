"""The sentences of `qkv explain gqa`, in English and Korean (the same keys in both)."""

from __future__ import annotations

EN = {
    "title": "qkv explain gqa · {model}",
    "intro": "Multi-head attention gives every head its own W_Q, W_K and W_V (guide: heads). When a model writes, it "
             "keeps every past token's K and V in the KV cache, and that cache grows with the heads. GQA and MQA "
             "(guide: gqa) let several query heads read one K/V head: the queries stay many, "
             "the cache shrinks.",

    "s_share": "① Who reads what: {H} query heads, {H_kv} K/V heads",
    "mha": "{model} is plain multi-head attention (MHA): each of its {H} query heads reads its own K/V head "
           "(h → h). Nothing is shared; ③ shows what sharing would do to it.",
    "share": "W_Q makes H = {H} queries per token, W_K and W_V only Hkv = {H_kv} keys and values: Q {kq}, "
             "K and V {kk}. Query head h reads K/V head h // (H/Hkv) = h // {G}: groups of {G} neighbours.",
    "col_kv": "K/V head", "col_queries": "query heads that read it",
    "share_check": "Layer {layer}'s scores of all {H} heads, recomputed as Q_h·K_(h // G)ᵀ/√d_k, equal the model's "
                   "(largest difference {diff:.1e}).",

    "s_cache": "② The cache it saves",
    "cache": "Per token the KV cache keeps K and V in every layer: 2·L·Hkv·d_k·4 bytes (L = {L}, d_k = {d_k}, "
             "float32). The same model with one K/V head per query head (MHA), its own (←), one for all (MQA):",
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

KO = {
    "title": "qkv explain gqa · {model}",
    "intro": "멀티헤드 어텐션에서는 헤드마다 W_Q, W_K, W_V가 따로 있습니다(가이드: 헤드). 모델이 글을 생성할 때는 지나간 "
             "모든 토큰의 K와 V를 KV 캐시에 저장하는데, 이 캐시는 헤드 수만큼 커집니다. GQA와 MQA"
             "(가이드: GQA)는 여러 쿼리 헤드가 K/V 헤드 하나를 함께 읽게 합니다: 쿼리는 그대로 많고, 캐시는 "
             "줄어듭니다.",

    "s_share": "① 누가 무엇을 읽나: 쿼리 헤드 {H}개, K/V 헤드 {H_kv}개",
    "mha": "{model}은(는) 평범한 멀티헤드 어텐션(MHA)입니다: 쿼리 헤드 {H}개가 각자 자기 K/V 헤드를 읽습니다(h → h). "
           "공유하는 것이 없습니다. 공유하면 어떻게 되는지는 ③에서 봅니다.",
    "share": "W_Q는 토큰마다 쿼리 H = {H}개를 만들고, W_K와 W_V는 키와 밸류를 Hkv = {H_kv}개만 만듭니다: Q {kq}, "
             "K와 V {kk}. 쿼리 헤드 h는 K/V 헤드 h // (H/Hkv) = h // {G}를 읽습니다: 이웃한 {G}개씩 한 그룹.",
    "col_kv": "K/V 헤드", "col_queries": "이를 읽는 쿼리 헤드",
    "share_check": "{layer}번 층의 헤드 {H}개 점수를 Q_h·K_(h // G)ᵀ/√d_k로 다시 계산하면 모델의 점수와 같습니다"
                   "(최대 차이 {diff:.1e}).",

    "s_cache": "② 줄어드는 캐시",
    "cache": "KV 캐시는 토큰마다 모든 층의 K와 V를 저장합니다: 2·L·Hkv·d_k·4 바이트(L = {L}, d_k = {d_k}, float32). "
             "같은 모델에서 쿼리 헤드마다 K/V 헤드를 하나씩 두는 경우(MHA), 이 모델(←), 모두가 하나를 쓰는 경우(MQA):",
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

TEXTS = {"en": EN, "ko": KO}
