"""The sentences of `qkv explain sparse`, in English and in Korean (the same keys; a test checks it)."""

from __future__ import annotations

EN = {
    "title": "qkv explain sparse · {model} · n = {n} tokens",
    "intro": "Full attention scores every query against every key: n² pairs, the O(n²) of the score matrix (guide: scores). A sparse "
             "pattern keeps a few keys per query and adds M = −∞ to the others. Adding M to the whole n × n "
             "matrix saves nothing; the tiled kernel (FlashAttention's online softmax, see `qkv explain flash`) "
             "asks the pattern, tile by tile, whether a tile of (query block, key block) is hidden entirely, "
             "and skips it: no Q·Kᵀ, no exp, no P·V.",
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

KO = {
    "title": "qkv explain sparse · {model} · n = {n} 토큰",
    "intro": "전체 어텐션은 모든 쿼리를 모든 키와 비교합니다: n² 쌍, 점수 행렬의 O(n²)입니다(가이드: 점수). 희소 패턴은 쿼리마다 "
             "일부 키만 남기고 나머지에는 M = −∞를 더합니다. n × n 행렬 전체에 M을 더하면 아무것도 절약되지 "
             "않습니다. 타일 커널(FlashAttention의 온라인 softmax, `qkv explain flash` 참고)은 (쿼리 블록, 키 블록) "
             "타일마다 패턴에 그 타일이 완전히 가려지는지 묻고, 그렇다면 건너뜁니다: Q·Kᵀ도, exp도, P·V도 없습니다.",
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

TEXTS = {"en": EN, "ko": KO}
