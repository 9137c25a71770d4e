"""Path patching (qkv.analysis.path_patch) and `qkv path-patch`, float64 on the tiny fixtures.

Checks that can fail:
  - against the same path patched by hand: GPT-2's receiver q, k, v computed by explicit matrix arithmetic from
    its weights (Δ = (Z_corr − Z_clean)·W_O rows, LayerNorm, W_Q/K/V + b), put into a whole clean forward by a
    hook on one head's q/k/v (also at one position only); a GQA receiver's k (Llama) and v (Gemma 2) by explicit
    attention over the altered K/V head for that query head alone, its Z hooked; Gemma 2 and Phi senders' Δ read
    from hooked passes, the receiver's q (or all of Z) from a pass on the altered stream — within 1e-10;
  - an empty sender set, or senders after every receiver, changes nothing: effect 0 within 1e-12; a sender reaches
    receivers of later layers only (one of its own layer beside them changes nothing);
  - identity: with every component before layer r (the embeddings, every head and FFN) as senders, the receivers'
    altered stream is the corrupted stream entering r, so path patching into all heads of r with channel all IS
    activation patching of layer r's heads from corrupted into clean (`patch_one` with the texts swapped), and with
    channel q it is the clean run with layer r's q replaced by the corrupted run's, on nine families (output norms,
    a residual multiplier, ALiBi, MoE among them), within 1e-10;
  - each table cell equals `path_patch` of that pair alone (batched = alone), NaN where no path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, patching_pair, run_main
from qkv.analysis.patch import patch_one
from qkv.analysis.path_patch import (EMBED, Node, every_sender, pair_table, parse_nodes, path_patch,
                                     sender_table)
from qkv.runtime.errors import QkvError

KEEP = ("residual", "heads", "attn_out", "ffn_out", "q", "k", "v", "attentions")
TOL = 1e-10


def inputs(name: str, n: int = 9, at: int = 2):
    """`conftest.patching_pair` with the token at 2 changed."""
    return patching_pair(name, n, at)


def metric_with(model, ids, metric, hooks=None) -> float:
    z = model.run(ids, keep=(), hooks=hooks).logits[-1]
    return float(z[metric[0]] - z[metric[1]])


def head_delta(model, c, k, layer: int, head: int) -> np.ndarray:
    """What one head's corrupted Z changes layer LAYER's output by, from a hooked pass (any family)."""
    def swap(z, _l):
        return k.layers[layer].heads[head][None]
    hooked = model.run(c.ids, keep=("attn_out",), hooks={f"{layer}.heads.{head}": swap})
    return hooked.layers[layer].attn_out - c.layers[layer].attn_out                      # (n, d_model)


def stream_at(model, ids, layer: int, x: np.ndarray, keep=KEEP):
    """A pass whose stream entering LAYER is X (n, d_model): what that layer makes of it."""
    return model.run(ids, keep=keep, hooks={f"{layer}.residual": lambda v, _l: x[None]}).layers[layer]


# ── against the same done by hand ───────────────────────────────────────────────

@pytest.mark.parametrize("channel", ["q", "k", "v"])
def test_gpt2_by_explicit_arithmetic(channel):
    model, clean, corrupted, metric = inputs("gpt2")
    cfg, w = model.config, model.weights
    H, dk = cfg.n_heads, cfg.d_head
    c, k = model.run(clean, keep=KEEP), model.run(corrupted, keep=KEEP)
    W_O = w.blocks[0].attn.W_O                                                 # (H·d_k, d_model)
    delta = sum((k.layers[0].heads[h] - c.layers[0].heads[h]) @ W_O[h * dk:(h + 1) * dk] for h in (1, 3))
    delta = delta + k.layers[0].residual - c.layers[0].residual                 # the embeddings' change
    x = c.layers[1].residual + delta                                           # (n, d_model) the receivers' input
    ln = w.blocks[1].attn_norm
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    h_in = (x - mu) / np.sqrt(var + cfg.norm_eps) * ln.weight + ln.bias           # (n, d_model)
    a = w.blocks[1].attn
    W, b = {"q": (a.W_Q, a.b_Q), "k": (a.W_K, a.b_K), "v": (a.W_V, a.b_V)}[channel]
    new = (h_in @ W + b).reshape(len(clean), H, dk).transpose(1, 0, 2)          # (H, n, d_k)
    m_clean = metric_with(model, clean, metric)
    for receivers, positions in (([2], None), ([0, 2], None), ([2], [-1])):
        def put(v, _l, r=None):                                                # (1, n, d_k) one head's
            v = v.copy()
            at = slice(None) if positions is None else positions
            v[0, at] = new[r][at]
            return v
        hooks = {f"1.{channel}.{r}": (lambda v, l, r=r: put(v, l, r)) for r in receivers}
        by_hand = metric_with(model, clean, metric, hooks) - m_clean
        p = path_patch(model, clean, corrupted, metric, senders="0.1,0.3,embed",
                       receivers=",".join(f"1.{r}" for r in receivers), channel=channel, positions=positions,
                       normalise=False)
        assert abs(p.effect - by_hand) < TOL * max(1.0, abs(by_hand)), (receivers, positions)
        assert abs(by_hand) > 1e-4                                             # the path carries something
    norm = path_patch(model, clean, corrupted, metric, senders="0.1,0.3,embed", receivers="1.2", channel=channel)
    assert norm.effect == pytest.approx((norm.patched - norm.clean) / (norm.clean - norm.corrupted), abs=1e-12)


def test_gqa_key_receiver_reads_altered_keys_alone():
    """Llama, 8 heads sharing 2 K/V heads: receiver 1.5 with channel k attends with the keys its K/V head (1)
    makes of the altered stream; heads 4, 6, 7 of its group keep the clean keys."""
    model, clean, corrupted, metric = inputs("llama_gqa")
    cfg, w = model.config, model.weights
    dk, group = cfg.d_head, cfg.n_heads // cfg.n_kv_heads
    c, k = model.run(clean, keep=KEEP), model.run(corrupted, keep=KEEP)
    W_O = w.blocks[0].attn.W_O
    x = c.layers[1].residual + (k.layers[0].heads[2] - c.layers[0].heads[2]) @ W_O[2 * dk:3 * dk]
    k_new = stream_at(model, clean, 1, x).k[5 // group]                         # (n, d_k) after RoPE
    q, v = c.layers[1].q[5], c.layers[1].v[5 // group]                          # (n, d_k) each
    s = q @ k_new.T / np.sqrt(dk) + np.triu(np.full((len(clean),) * 2, -np.inf), 1)
    a = np.exp(s - s.max(-1, keepdims=True))
    z = (a / a.sum(-1, keepdims=True)) @ v                                      # (n, d_k)
    by_hand = metric_with(model, clean, metric, {"1.heads.5": lambda _v, _l: z[None]})
    by_hand -= metric_with(model, clean, metric)
    p = path_patch(model, clean, corrupted, metric, senders="0.2", receivers="1.5", channel="k", normalise=False)
    assert abs(p.effect - by_hand) < TOL and abs(by_hand) > 1e-5
    whole = path_patch(model, clean, corrupted, metric, senders="0.2", receivers="1.4,1.5,1.6,1.7", channel="k",
                       normalise=False)
    assert abs(whole.effect - p.effect) > 1e-6                                 # group mates are receivers only if named


def test_gemma2_by_hooks():
    """Gemma 2 (output norms, soft-capped scores, a sliding window, GQA): senders 0.1 and 1.ffn, receiver 2.1,
    channel q by a hooked q, channel v by explicit A·V over the altered value head."""
    model, clean, corrupted, metric = inputs("gemma2", at=6)
    c, k = model.run(clean, keep=KEEP), model.run(corrupted, keep=KEEP)
    x = c.layers[2].residual + head_delta(model, c, k, 0, 1) + k.layers[1].ffn_out - c.layers[1].ffn_out
    at = stream_at(model, clean, 2, x)
    m_clean = metric_with(model, clean, metric)
    group = model.config.n_heads // model.config.n_kv_heads
    z = c.layers[2].attentions[1] @ at.v[1 // group]                            # (n, d_k) A unchanged, V altered
    for channel, hooks in (("q", {"2.q.1": lambda _v, _l: at.q[1][None]}),
                           ("v", {"2.heads.1": lambda _v, _l: z[None]})):
        by_hand = metric_with(model, clean, metric, hooks) - m_clean
        p = path_patch(model, clean, corrupted, metric, senders=["0.1", "1.ffn"], receivers="2.1", channel=channel,
                       normalise=False)
        assert abs(p.effect - by_hand) < TOL and abs(by_hand) > 1e-6, channel


@pytest.mark.parametrize("name", ["phi", "gptj"])
def test_parallel_blocks_channel_all_by_hooks(name):
    """Phi, GPT-J (parallel attention and FFN, partial RoPE): with channel all the receiver's Z is what its layer
    makes of the altered stream, read from a pass whose stream entering layer 1 is that stream."""
    model, clean, corrupted, metric = inputs(name)
    c, k = model.run(clean, keep=KEEP), model.run(corrupted, keep=KEEP)
    x = c.layers[1].residual + head_delta(model, c, k, 0, 0) + k.layers[0].ffn_out - c.layers[0].ffn_out
    z = stream_at(model, clean, 1, x).heads[3]                                  # (n, d_k)
    by_hand = metric_with(model, clean, metric, {"1.heads.3": lambda _v, _l: z[None]})
    by_hand -= metric_with(model, clean, metric)
    p = path_patch(model, clean, corrupted, metric, senders="0.0,0.ffn", receivers="1.3", channel="all",
                   normalise=False)
    assert abs(p.effect - by_hand) < TOL and abs(by_hand) > 1e-6


# ── identities ───────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "gemma2", "phi", "gptj"])
def test_no_senders_no_effect(name):
    model, clean, corrupted, metric = inputs(name)
    L = model.config.n_layers
    for senders in ("", f"{L - 1}.0,{L - 1}.ffn"):                              # none; none before the receiver
        p = path_patch(model, clean, corrupted, metric, senders=senders, receivers=f"{L - 1}.0,{L - 1}.1",
                       channel="all")
        assert abs(p.effect) < 1e-12


def test_a_sender_reaches_later_layers_only():
    """A sender in layer 1 reaches receiver 2.1, not receiver 1.2 beside it: 1.2 then reads the clean stream, and
    adding it to the receivers changes nothing."""
    model, clean, corrupted, metric = inputs("gemma2", at=5)
    both = path_patch(model, clean, corrupted, metric, senders="1.0,1.ffn", receivers="1.2,2.1", channel="all")
    later = path_patch(model, clean, corrupted, metric, senders="1.0,1.ffn", receivers="2.1", channel="all")
    assert abs(later.effect) > 1e-6 and abs(both.effect - later.effect) < TOL


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "gemma2", "phi", "gptj", "olmo2", "granite", "bloom", "mixtral"])
def test_everything_before_a_layer_is_activation_patching_of_its_heads(name):
    model, clean, corrupted, metric = inputs(name, at=5)
    L, H = model.config.n_layers, model.config.n_heads
    r = L - 1
    before = [s for s in every_sender(model) if s.layer < r]
    heads = [Node(r, h) for h in range(H)]
    m_clean = metric_with(model, clean, metric)
    p = path_patch(model, clean, corrupted, metric, senders=before, receivers=heads, channel="all", normalise=False)
    plain = patch_one(model, corrupted, clean, metric, "heads", r, normalise=False)   # corrupted heads into clean
    assert abs(plain) > 1e-5 and abs(p.effect - plain) < TOL
    q = model.run(corrupted, keep=("q",)).layers[r].q
    by_hand = metric_with(model, clean, metric, {f"{r}.q": lambda _v, _l: q[None]}) - m_clean
    p = path_patch(model, clean, corrupted, metric, senders=before, receivers=heads, channel="q", normalise=False)
    assert abs(by_hand) > 1e-6 and abs(p.effect - by_hand) < TOL


# ── tables ───────────────────────────────────────────────────────────────────────

def test_tables_equal_each_path_alone():
    model, clean, corrupted, metric = inputs("gemma2", at=5)
    t = sender_table(model, clean, corrupted, metric, receivers="1.0,2.3", channel="k", batch=5)
    assert t.values.shape == (len(every_sender(model)), 1) and t.passes == -(-t.runs // 5)
    for s, v in zip(t.senders, t.values[:, 0]):
        if s.layer >= 2:
            assert np.isnan(v)                                                # reaches no receiver
            continue
        alone = path_patch(model, clean, corrupted, metric, senders=[s], receivers="1.0,2.3", channel="k").effect
        assert abs(v - alone) < TOL, s
    heads = t.heads()
    assert heads.shape == (3, 4) and np.isnan(heads[2]).all()
    assert heads[0, 1] == t.values[t.senders.index(Node(0, 1)), 0]
    pairs = pair_table(model, clean, corrupted, metric, senders="embed,0.2,1.ffn", receivers="1.1,2.0", channel="all")
    assert pairs.senders == [Node(EMBED), Node(0, 2), Node(1)]
    assert np.isnan(pairs.values[2, 0]) and not np.isnan(pairs.values[:, 1]).any()
    for i, s in enumerate(pairs.senders):
        for j, r in enumerate(pairs.receivers):
            if not np.isnan(pairs.values[i, j]):
                alone = path_patch(model, clean, corrupted, metric, senders=[s], receivers=r, channel="all")
                assert abs(pairs.values[i, j] - alone.effect) < TOL
    data = json.loads(json.dumps(t.as_json()))
    assert data["values"][-1] == [None] and data["receivers"] == ["1.0,2.3"]


# ── refusals ─────────────────────────────────────────────────────────────────────

def test_refusals_are_one_line():
    model, clean, corrupted, metric = inputs("gpt2")
    for kwargs, match in (({"channel": "o"}, "channel"), ({"receivers": "1.ffn"}, "not a component"),
                          ({"receivers": "2.0"}, "outside"), ({"senders": "0.9"}, "outside"),
                          ({"receivers": ""}, "at least one receiver"), ({"positions": [9]}, "positions"),
                          ({"receivers": "embed"}, "no head")):
        args = {"senders": "0.1", "receivers": "1.0", "channel": "q", **kwargs}
        with pytest.raises(QkvError, match=match) as e:
            path_patch(model, clean, corrupted, metric, **args)
        assert len(str(e.value).splitlines()) == 1
    bert = qkv.load(MODELS / "bert")
    with pytest.raises(QkvError, match="encoder"):
        path_patch(bert, [1, 2, 3], [1, 4, 3], lambda h: h[:, 0, 0], senders="0.1", receivers="1.0")
    whisper = qkv.load(MODELS / "whisper")
    with pytest.raises(QkvError, match="encoder–decoder"):
        path_patch(whisper, [1, 2], [1, 3], lambda z: z[:, 0], senders="", receivers="0.0")
    assert parse_nodes(model, "embed, 1.ffn ,0.2,-1.3") == [Node(EMBED), Node(0, 2), Node(1, 3), Node(1)]


def test_cli(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "path-patch", "a b c d e", "a b d d e",
                              "--model", str(MODELS / "gpt2"), "--token", " e", "--other", " d", "--receivers",
                              "1.0,1.2", "--channel", "v", "--json", str(tmp_path / "p.json"), "--out",
                              str(tmp_path / "out"))
    assert code == 0, err
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["receivers"] == ["1.0,1.2"] and len(data["values"]) == len(data["senders"])
    assert (tmp_path / "out" / "path_patch.png").exists() and "1.0,1.2" in out
    code, out, err = run_main(monkeypatch, capsys, "path-patch", "a b c d e", "a b d d e",
                              "--model", str(MODELS / "gpt2"), "--token", " e", "--other", " d", "--receivers", "1.0",
                              "--channel", "all", "--senders", "0.1,embed", "--json", str(tmp_path / "one.json"))
    assert code == 0, err
    one = json.loads((tmp_path / "one.json").read_text())
    assert one["senders"] == ["embed", "0.1"] and one["channel"] == "all"
    code, _, err = run_main(monkeypatch, capsys, "path-patch", "a b c", "a b d",
                            "--model", str(MODELS / "gpt2"), "--token", " e", "--other", " d", "--receivers", "1.0",
                            "--channel", "z")
    assert code == 2
    for more, said in ((("--senders", "1.1"), "no path"), (("--senders", ""), "at least one sender"),
                       (("--position", "7"), "positions")):
        code, _, err = run_main(monkeypatch, capsys, "path-patch", "a b c d e", "a b d d e", "--model",
                                str(MODELS / "gpt2"), "--token", " e", "--other", " d", "--receivers", "1.0", *more)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
