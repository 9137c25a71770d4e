"""The sentences of `qkv explain flash`, in English and in Korean (the same keys; a test checks it)."""

from __future__ import annotations

EN = {
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

KO = {
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

TEXTS = {"en": EN, "ko": KO}
