"""The dictionary box's other activations (JumpReLU, ReLU) and transcoders: encode and decode by hand, and the
config's refusals, each one line."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.features.sae import SAE, SAEConfig
from qkv.runtime.errors import QkvError


def _params(rng, d_in: int, d_sae: int, d_out: int, **extra) -> dict[str, np.ndarray]:
    return {"W_enc": rng.normal(size=(d_in, d_sae)), "b_enc": rng.normal(size=d_sae),
            "W_dec": rng.normal(size=(d_sae, d_out)), "b_dec": rng.normal(size=d_out), **extra}


def test_jumprelu_keeps_what_passes_its_threshold():
    rng = np.random.default_rng(0)
    theta = np.abs(rng.normal(size=16))
    sae = SAE(SAEConfig(d_in=6, d_sae=16, architecture="jumprelu"), _params(rng, 6, 16, 6, threshold=theta))
    x = rng.normal(size=(5, 6))
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    z = sae.encode(x)
    assert np.array_equal(z, np.where(pre > theta, pre, 0))
    assert 0 < np.count_nonzero(z) < z.size                     # some pass, some do not: not vacuous
    assert np.allclose(sae.forward(x)[0], z @ sae.W_dec + sae.b_dec)


def test_relu_and_a_skip_transcoder():
    rng = np.random.default_rng(1)
    cfg = SAEConfig(d_in=6, d_sae=12, architecture="relu", apply_b_dec_to_input=False, d_out=4, site="ffn_in",
                    site_out="ffn_out")
    sae = SAE(cfg, _params(rng, 6, 12, 4, W_skip=rng.normal(size=(6, 4))))
    x = rng.normal(size=(3, 6))
    z = np.maximum(x @ sae.W_enc + sae.b_enc, 0)
    y, got = sae.forward(x)
    assert np.allclose(got, z) and np.allclose(y, z @ sae.W_dec + sae.b_dec + x @ sae.W_skip)
    assert cfg.transcoder and cfg.width_out == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"architecture": "gated"}, "unknown architecture"),
    ({"architecture": "topk"}, "needs k"),
    ({"architecture": "relu", "d_out": 6}, "apply_b_dec_to_input"),
    ({"architecture": "relu", "d_out": 0, "apply_b_dec_to_input": False}, "d_out must be"),
])
def test_bad_configs_are_one_line(kwargs, message):
    with pytest.raises(QkvError, match=message) as e:
        SAEConfig(d_in=6, d_sae=12, **kwargs).check()
    assert "\n" not in str(e.value)


def test_arrays_must_fit_the_architecture():
    rng = np.random.default_rng(2)
    with pytest.raises(QkvError, match="threshold"):                # JumpReLU without its θ
        SAE(SAEConfig(d_in=6, d_sae=8, architecture="jumprelu"), _params(rng, 6, 8, 6))
    with pytest.raises(QkvError, match="W_skip"):                   # an SAE has no skip
        SAE(SAEConfig(d_in=6, d_sae=8, k=2), _params(rng, 6, 8, 6, W_skip=np.zeros((6, 6))))
