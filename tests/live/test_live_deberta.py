"""DeBERTa (v1) and DeBERTa-v2/v3 against live transformers, on random checkpoints of other knob values than the
committed fixtures: pos_att_type c2p, p2c, both or none (relative_attention off), share_att_key on and off,
position_buckets off, small and large (the log buckets against transformers' own make_log_bucket_position),
max_relative_positions below and above the input's length, norm_rel_ebd, absolute positions on and off, token
types, both heads (legacy true / false) and none, gelu / gelu_new / relu, 1–3 layers, d_head 8–16, the
convolution beside the first layer (conv_kernel_size 1, 3, 5; conv_act tanh, gelu, relu); v1 with
p2p counted in its scale. Each is saved, loaded by qkv and compared on a right- and a left-padded batch
(hidden states and logits within 1e-4, attention weights within 1e-5 on the real query rows; transformers' padded
rows are uniform, qkv's are not compared). A model qkv saves reads back in transformers with equal logits, the
three terms sum to the scores exactly on each case, and the masked-LM cases' gradients equal torch autograd's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, case_seed, check_encoder_live, check_encoder_saved_by_qkv,
                          check_masked_lm_gradients, saved_and_loaded)
from transformers import DebertaConfig, DebertaForMaskedLM, DebertaModel, DebertaV2Config, DebertaV2ForMaskedLM, \
    DebertaV2Model
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

from qkv.core.disentangled import log_buckets

pytestmark = pytest.mark.live


def v2(d=48, heads=4, layers=2, ff=64, terms="c2p|p2c", relative=True, buckets=-1, far=-1, share=False,
       norm="none", absolute=False, types=0, legacy=True, act="gelu", P=64, conv=0, conv_act="tanh"):
    return DebertaV2Config(vocab_size=211, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                           intermediate_size=ff, hidden_act=act, max_position_embeddings=P, type_vocab_size=types,
                           relative_attention=relative, pos_att_type=terms, position_buckets=buckets,
                           max_relative_positions=far, share_att_key=share, norm_rel_ebd=norm,
                           position_biased_input=absolute, legacy=legacy, layer_norm_eps=1e-7, pad_token_id=0,
                           conv_kernel_size=conv, conv_act=conv_act, initializer_range=INIT_RANGE,
                           attn_implementation="eager")


def v1(d=48, heads=4, layers=2, ff=64, terms="c2p|p2c", relative=True, far=-1, absolute=True, types=0, act="gelu"):
    return DebertaConfig(vocab_size=211, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                         intermediate_size=ff, hidden_act=act, max_position_embeddings=64, type_vocab_size=types,
                         relative_attention=relative, pos_att_type=terms, max_relative_positions=far,
                         position_biased_input=absolute, layer_norm_eps=1e-7, pad_token_id=0,
                         initializer_range=INIT_RANGE, attn_implementation="eager")


CASES = [
    pytest.param(DebertaV2ForMaskedLM, v2(buckets=16, share=True, norm="layer_norm", legacy=False),
                 id="v3-buckets16-share-norm-lmpredictions"),
    pytest.param(DebertaV2ForMaskedLM, v2(terms="c2p", buckets=6, far=20, absolute=True, types=2),
                 id="v2-c2p-buckets6-far20-abs-types"),
    pytest.param(DebertaV2ForMaskedLM, v2(terms=["p2c"], share=True, far=5, act="gelu_new", layers=3),
                 id="v2-p2c-share-far5-L3"),
    pytest.param(DebertaV2Model, v2(relative=False, terms="c2p|p2c", absolute=True, d=64, heads=4),
                 id="v2-relative-off"),
    pytest.param(DebertaV2Model, v2(terms=None, relative=True, absolute=True, heads=6), id="v2-no-terms-h6"),
    pytest.param(DebertaV2ForMaskedLM, v2(buckets=4, far=8, norm="layer_norm|x", act="relu", layers=1, d=32,
                                          heads=2), id="v2-buckets4-far8-relu-L1-dk16"),
    pytest.param(DebertaV2ForMaskedLM, v2(buckets=16, far=64, share=True, norm="layer_norm", conv=3, conv_act="gelu"),
                 id="v2-xlarge-layout-conv3-gelu"),
    pytest.param(DebertaV2ForMaskedLM, v2(terms="p2c", conv=5, layers=1, legacy=False), id="v2-conv5-tanh-L1"),
    pytest.param(DebertaV2Model, v2(conv=1, conv_act="relu", absolute=True, types=2), id="v2-model-conv1-relu"),
    pytest.param(DebertaForMaskedLM, v1(far=6, types=2), id="v1-far6-types"),
    pytest.param(DebertaForMaskedLM, v1(terms="p2c|p2p", absolute=False, heads=6, act="gelu_new"),
                 id="v1-p2c-p2p-noabs-h6"),
    pytest.param(DebertaModel, v1(terms="c2p", far=30, layers=3), id="v1-model-c2p-far30"),
]


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_deberta(cls, config, tmp_path, request):
    model, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    ids, _ = check_encoder_live(model, ours, config, (("right", [19, 7, 13]), ("left", [19, 6, 13])),
                                request.node.callspec.id, pad_id=0)
    t = ours.run(ids[0], keep=("scores", "scores_c2c", "scores_c2p", "scores_p2c"))
    for layer in t.layers.values():
        terms = [x for x in (layer.scores_c2p, layer.scores_p2c) if x is not None]
        if not terms:                                                    # no disentangled attention: no tables
            assert layer.scores_c2c is None and ours.config.disentangled is None
            continue
        assert np.array_equal(layer.scores, layer.scores_c2c + (terms[0] if len(terms) == 1 else terms[0] + terms[1]))


@pytest.mark.parametrize(("cls", "config"), [c for c in CASES if c.id in (
    "v3-buckets16-share-norm-lmpredictions", "v2-c2p-buckets6-far20-abs-types", "v2-xlarge-layout-conv3-gelu",
    "v1-far6-types")])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    assert config.pad_token_id == 0                        # the helper pads with the config's pad id
    check_encoder_saved_by_qkv(cls, config, tmp_path, [18, 7])


@pytest.mark.parametrize("buckets, far", [(8, 64), (16, 512), (256, 512), (6, 20), (4, 8), (32, 33), (10, 4)])
def test_log_buckets_equal_transformers(buckets, far):
    """Every distance up to ±2·far (float32 rounding up to the same bucket as torch's)."""
    r = np.arange(-2 * far, 2 * far + 1)
    theirs = make_log_bucket_position(torch.from_numpy(r), buckets, far).to(torch.long).numpy()
    assert np.array_equal(log_buckets(r, buckets, far), theirs)


MASKED_LM_CASES = [c for c in CASES if c.values[0].__name__.endswith("ForMaskedLM")]


@pytest.mark.parametrize(("cls", "config"), MASKED_LM_CASES)
def test_masked_lm_gradients_equal_autograd(cls, config, tmp_path, request):
    """qkv.train.gradients with labels against torch autograd of transformers' *ForMaskedLM loss on a right- or
    left-padded batch: loss within 1e-5, each gradient within 1e-4 relative error (or 1e-6 absolute where it is 0
    but for rounding: K's bias and c2p's b_Kr, the same for every key a query sees)."""
    assert config.pad_token_id == 0                        # the helper pads with the config's pad id
    check_masked_lm_gradients(cls, config, tmp_path, case_seed(request), [15, 8, 11])
