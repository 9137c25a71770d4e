"""The encoders after BERT against live transformers, on random checkpoints of many shapes: RoBERTa,
XLM-RoBERTa, DistilBERT, ELECTRA (generator and discriminator), ModernBERT (every layer global), with and
without their masked-LM heads.

Each case builds a seeded, perturbed model with other knob values — RoBERTa / XLM-R: pad ids 1, 3 or 0
(positions from row pad + 1), one or two token types, tied or untied head, gelu / gelu_new / relu, 1–3
layers, d_head 8–16; DistilBERT: learned or sinusoidal positions, gelu / relu, tied or untied; ELECTRA:
embeddings narrower than, or as wide as, the blocks; ModernBERT: RoPE bases, attention and norm biases or
none, head bias and decoder bias, tied or untied — saves it, loads it with qkv and compares a right-
and a left-padded batch, padded with the model's pad id (hidden states and logits within 1e-4, attention
weights within 1e-5). A model qkv saves is read back by transformers with equal logits. Encoders do not
write: there is no greedy generation to compare, and `generate` refuses them (tests/test_family_encoders.py).
"""

from __future__ import annotations

import pytest
from live_helpers import (INIT_RANGE, case_seed, check_encoder_live, check_encoder_saved_by_qkv,
                          check_masked_lm_gradients, saved_and_loaded)
from transformers import (DistilBertConfig, DistilBertForMaskedLM, DistilBertModel, ElectraConfig, ElectraForMaskedLM,
                          ElectraForPreTraining, ElectraModel, ModernBertConfig, ModernBertForMaskedLM,
                          ModernBertModel, RobertaConfig, RobertaForMaskedLM, RobertaModel,
                          XLMRobertaConfig, XLMRobertaForMaskedLM, XLMRobertaModel)

pytestmark = pytest.mark.live


def roberta(cls=RobertaConfig, d=64, heads=4, layers=2, ff=96, pad=1, types=1, tied=True, act="gelu", eps=1e-5,
            vocab=211):
    return cls(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
               intermediate_size=ff, hidden_act=act, layer_norm_eps=eps, max_position_embeddings=40 + pad + 1,
               type_vocab_size=types, tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=pad,
               bos_token_id=0, eos_token_id=2, attn_implementation="eager")


def distilbert(d=64, heads=4, layers=2, ff=96, sinusoidal=False, act="gelu", tied=True, pad=0, vocab=211):
    return DistilBertConfig(vocab_size=vocab, dim=d, n_heads=heads, n_layers=layers, hidden_dim=ff,
                            max_position_embeddings=40, sinusoidal_pos_embds=sinusoidal, activation=act,
                            tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=pad,
                            attn_implementation="eager")


def electra(E=32, d=64, heads=4, layers=2, ff=96, act="gelu", tied=True, eps=1e-12, types=2, vocab=211):
    return ElectraConfig(vocab_size=vocab, embedding_size=E, hidden_size=d, num_attention_heads=heads,
                         num_hidden_layers=layers, intermediate_size=ff, hidden_act=act, layer_norm_eps=eps,
                         max_position_embeddings=40, type_vocab_size=types, tie_word_embeddings=tied,
                         initializer_range=INIT_RANGE, pad_token_id=0, attn_implementation="eager")


def modernbert(d=64, heads=4, layers=2, ff=96, theta=160000.0, bias=False, norm_bias=False, act="gelu",
               head_act="gelu", head_bias=False, decoder_bias=True, tied=True, eps=1e-5, pad=1, vocab=211, every=1,
               local=128, local_theta=10000.0):
    return ModernBertConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                            intermediate_size=ff, global_attn_every_n_layers=every, global_rope_theta=theta,
                            local_attention=local, local_rope_theta=local_theta,
                            attention_bias=bias, norm_bias=norm_bias, hidden_activation=act,
                            classifier_activation=head_act, classifier_bias=head_bias, decoder_bias=decoder_bias,
                            tie_word_embeddings=tied, norm_eps=eps, max_position_embeddings=64, pad_token_id=pad,
                            bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2,
                            initializer_range=INIT_RANGE, attn_implementation="eager")


CASES = [
    pytest.param(RobertaForMaskedLM, roberta(), id="roberta-mlm-pad1-tied"),
    pytest.param(RobertaForMaskedLM, roberta(d=48, heads=3, layers=3, pad=0, types=2, tied=False, act="gelu_new"),
                 id="roberta-mlm-pad0-types2-untied-gelu_new-L3"),
    pytest.param(RobertaModel, roberta(d=64, heads=8, layers=1, act="relu", eps=1e-12), id="roberta-model-h8-relu-L1"),
    pytest.param(XLMRobertaForMaskedLM, roberta(XLMRobertaConfig, d=32, heads=2, pad=3, types=2, tied=False),
                 id="xlmr-mlm-pad3-untied-dk16"),
    pytest.param(XLMRobertaModel, roberta(XLMRobertaConfig, d=48, heads=4, pad=1), id="xlmr-model-dk12"),
    pytest.param(DistilBertForMaskedLM, distilbert(sinusoidal=True, act="relu"), id="distilbert-mlm-sinusoidal-relu"),
    pytest.param(DistilBertForMaskedLM, distilbert(d=48, heads=3, layers=3, tied=False), id="distilbert-mlm-untied-L3"),
    pytest.param(DistilBertModel, distilbert(d=32, heads=4, layers=1, sinusoidal=True), id="distilbert-model-dk8-L1"),
    pytest.param(ElectraForMaskedLM, electra(), id="electra-generator-E32"),
    pytest.param(ElectraForMaskedLM, electra(E=48, d=48, heads=3, tied=False, act="gelu_new", types=1),
                 id="electra-generator-E=d-untied"),
    pytest.param(ElectraForPreTraining, electra(E=24, d=48, heads=4, layers=3, eps=1e-7), id="electra-discriminator-E24-L3"),
    pytest.param(ElectraModel, electra(E=16, d=64, heads=8, act="relu"), id="electra-model-E16-h8-relu"),
    pytest.param(ModernBertForMaskedLM, modernbert(), id="modernbert-mlm-global-tied"),
    pytest.param(ModernBertForMaskedLM, modernbert(layers=3, every=3, local=6, local_theta=500.0),
                 id="modernbert-mlm-local-window6-every3"),
    pytest.param(ModernBertModel, modernbert(layers=4, every=2, local=4, theta=1e4, local_theta=2e3, heads=2),
                 id="modernbert-model-local-window4-every2-h2"),
    pytest.param(ModernBertForMaskedLM, modernbert(d=48, heads=3, layers=3, theta=10000.0, bias=True, norm_bias=True,
                                                   head_act="gelu_new", head_bias=True, decoder_bias=False, tied=False),
                 id="modernbert-mlm-L3-biases-norm_bias-untied-nodecoderbias"),
    pytest.param(ModernBertModel, modernbert(d=64, heads=8, layers=1, act="gelu_new", eps=1e-6, pad=0),
                 id="modernbert-model-h8-dk8-L1"),
]


def _vocab_logits(model, ref, vocab: int):
    """The reference's logits when they are a vocabulary's (not the discriminator's one score per token)."""
    return ref.logits if ref.logits is not None and ref.logits.shape[-1] == vocab else None


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_encoder(cls, config, tmp_path, request):
    model, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    check_encoder_live(model, ours, config, (("right", [11, 7, 9]), ("left", [11, 6, 9])), request.node.callspec.id,
                       pad_id=config.pad_token_id, logits=lambda ref, *_: _vocab_logits(model, ref, config.vocab_size))


@pytest.mark.parametrize(("cls", "config"), [
    pytest.param(RobertaForMaskedLM, roberta(tied=False, pad=1), id="roberta"),
    pytest.param(DistilBertForMaskedLM, distilbert(sinusoidal=True), id="distilbert"),
    pytest.param(ElectraForMaskedLM, electra(), id="electra"),
    pytest.param(XLMRobertaForMaskedLM, roberta(XLMRobertaConfig, pad=3), id="xlm-roberta"),
    pytest.param(ModernBertForMaskedLM, modernbert(bias=True, tied=False), id="modernbert"),
])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    check_encoder_saved_by_qkv(cls, config, tmp_path, [10, 7])


MASKED_LM_CASES = [c for c in CASES if c.values[0].__name__.endswith("ForMaskedLM")]


@pytest.mark.parametrize(("cls", "config"), MASKED_LM_CASES)
def test_masked_lm_gradients_equal_autograd(cls, config, tmp_path, request):
    """qkv.train.gradients with labels against torch autograd of transformers' *ForMaskedLM loss, on a
    right- or left-padded batch: loss within 1e-5, each gradient within 1e-4 relative error (or 1e-6
    absolute where it is 0 but for rounding: K's bias, the same for every key a query sees)."""
    check_masked_lm_gradients(cls, config, tmp_path, case_seed(request), [12, 8, 10])
