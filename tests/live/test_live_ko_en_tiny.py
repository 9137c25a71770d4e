"""ko-en-tiny read by transformers' MarianMTModel: the same logits and cross-attention as qkv, and the same greedy translations."""

from __future__ import annotations

import numpy as np
import torch
from transformers import MarianMTModel

import qkv
from qkv.checkpoints import ko_en_dir


def test_transformers_reads_ko_en_tiny():
    ours = qkv.load("ko-en-tiny")
    ref = MarianMTModel.from_pretrained(ko_en_dir(), attn_implementation="eager").eval()
    texts = ["나는 학교에 간다", "그녀는 공원에서 책을 읽었어요", "학생들은 빵을 먹을 것입니다"]
    rows = [ours.encode(t)[0] for t in texts]
    n = max(map(len, rows))
    src = np.zeros((len(rows), n), np.int64)
    mask = np.zeros_like(src)
    for i, r in enumerate(rows):
        src[i, :len(r)], mask[i, :len(r)] = r, 1
    greedy = ours.generate(src, max_new_tokens=12, attention_mask=mask)
    with torch.no_grad():
        expected = ref.generate(torch.tensor(src), attention_mask=torch.tensor(mask), max_new_tokens=12,
                                do_sample=False, num_beams=1).numpy()
        out = ref(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                  decoder_input_ids=torch.tensor(greedy), output_attentions=True)
    assert greedy.shape == expected.shape and (greedy == expected).all()
    mine = ours.forward(src, mask, decoder_input_ids=greedy)
    assert np.abs(mine.logits - out.logits.numpy()).max() < 1e-4
    cross = np.stack([a.numpy() for a in out.cross_attentions])
    assert np.abs(mine.cross_attentions - cross).max() < 1e-5
    assert ours.tokenizer.decode(greedy[0, 1:], skip_special_tokens=True) == "I go to school"
