"""Forward-only prompt attribution: which input tokens (or spans of them) made an output, from forward passes
alone — occlusion (leave-one-out) and Shapley values over the tokens as players.

The output is input_attribution's one number z (`Output`: a target logit, a logit difference, a masked-LM
token's logit, an encoder's cosine). A coalition S of players (tokens, words, or given groups of positions)
is the text with every player outside S replaced by the BASELINE at the embedding: the token rows
e_i = E[ids_i]·s of the players in S, b_i of the others, positions kept (so no later token moves):

    zero    b_i = 0, the zero embedding (integrated gradients' default baseline)
    pad     b_i = the pad token's embedding (EOS where there is none), every position the same

(`input_attribution.baseline_rows`). Deleting a token instead would shift every later position and change
the text's length, so the difference would mix the token's part with the positions'; it is not offered.
The first token, every later token's attention sink, stays itself by default (KEEP_FIRST), as for IG: it
is not a player and its score is 0. With v(S) = z of coalition S and N the p players:

    occlusion   φ_i = v(N) − v(N \\ {i})                         one pass of p + 1 rows
    shapley     φ_i = Σ_{S ⊆ N∖{i}} |S|!(p−|S|−1)!/p! · (v(S ∪ {i}) − v(S))
                exact: every one of the 2^p coalitions (p ≤ EXACT_PLAYERS by default)
                sampled: the mean over permutations π of v(π before i, and i) − v(π before i)
                (Castro et al. 2009); each permutation's p marginals telescope to v(N) − v(∅), so
                Σ φ = v(N) − v(∅) = z(x) − z(baseline) exactly for the sampled values too (efficiency,
                checked to EFFICIENCY of |z(x) − z(b)| on every call). With ANTITHETIC, each permutation
                comes with its reverse (a player late in one is early in the other: less variance for the
                same passes). The permutations come from numpy's default_rng(SEED): the same call gives
                the same numbers.

Every coalition is one row of a batch (BATCH_TOKENS tokens a pass, as IG's nodes); coalitions asked for
twice (the empty and the full text, once per permutation) run once. Spans: "tokens" (each token a player),
"words" (a token that starts with a space or a newline, or follows a newline, starts a word; punctuation
joins the word before it; in WordPiece, every token but a "##" continuation starts one), or explicit groups of positions ("0-2,3,5-7"; positions in no
group stay themselves). A span's score is shared equally by its tokens in `scores`, so Σ scores = Σ φ;
`span_scores` holds the players' own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .input_attribution import BASELINES, BATCH_TOKENS, InputAttribution, _z, baseline_rows, output_of

if TYPE_CHECKING:
    from ..models.model import Model

METHODS = ("occlusion", "shapley")
SPANS = ("tokens", "words")
SAMPLES = 64                 # permutations of sampled Shapley values
MAX_SAMPLES = 100_000
EXACT_PLAYERS = 10           # exact enumeration by default up to this many players (2^10 = 1024 rows)
MAX_EXACT_PLAYERS = 16       # and on request up to this many (65,536 rows)
SPACES = ("␣", "▁", "↵")     # a label starting with one of these begins a word
EFFICIENCY = 1e-9            # |Σ φ − (z(x) − z(b))| allowed, relative to max(1, |z(x) − z(b)|) (float64 sums)


@dataclass
class PromptAttribution(InputAttribution):
    """Occlusion or Shapley scores: InputAttribution's per-token `scores` (n,) (a span's shared equally by its
    tokens), and the players' own. `logit` is z(x); `baseline_logit` z(baseline) (shapley: the sum's target)."""

    spans: list[list[int]] | None = None        # the p players: each a list of token positions
    span_scores: np.ndarray | None = None       # (p,) float64
    exact: bool = False                         # shapley by enumeration of all 2^p coalitions
    samples: int | None = None                  # sampled shapley: permutations used (antithetic pairs: even)
    seed: int | None = None
    antithetic: bool = False
    evaluations: int = 0                        # rows run (distinct coalitions)

    @property
    def completeness(self) -> float | None:
        """shapley: |Σ φ − (z(x) − z(b))| / |z(x) − z(b)| (0 up to rounding: efficiency); occlusion: None."""
        if self.method != "shapley" or self.baseline_logit is None:
            return None
        return InputAttribution.completeness.fget(self)

    @property
    def efficiency_error(self) -> float | None:
        """shapley: |Σ φ − (z(x) − z(b))|, absolute (None for occlusion)."""
        if self.method != "shapley":
            return None
        return abs(float(self.span_scores.sum()) - (self.logit - self.baseline_logit))

    def to_json(self) -> dict:
        out = InputAttribution.to_json(self)
        out |= {"baseline": self.baseline, "baseline_logit": self.baseline_logit, "players": len(self.spans),
                "spans": self.spans, "span_scores": [float(s) for s in self.span_scores],
                "evaluations": self.evaluations}
        if self.method == "shapley":
            out |= {"exact": self.exact, "samples": self.samples, "seed": self.seed, "antithetic": self.antithetic,
                    "efficiency_error": self.efficiency_error, "completeness_error": self.completeness}
        return out


def prompt_attribution(model: "Model", text_or_ids: str | Sequence[int], target: str | int | None = None,
                       other: str | int | None = None, *, method: str = "shapley", baseline: str = "zero",
                       keep_first: bool = True, spans: str | Sequence[Sequence[int]] = "tokens",
                       samples: int = SAMPLES, seed: int = 0, exact: bool | None = None, antithetic: bool = True,
                       compare: str | None = None, batch: int | None = None) -> PromptAttribution:
    """Attribute z (input_attribution.output_of: TARGET's logit after TEXT, its top-1 by default, or
    logit(target) − logit(other), or an encoder's cosine to COMPARE's) to the players SPANS ("tokens",
    "words", "0-2,3" or a list of position lists) by METHOD ("occlusion" or "shapley"), each absent player's
    token rows replaced by BASELINE ("zero" or "pad"). Shapley: EXACT True enumerates every coalition, False
    samples SAMPLES permutations (numpy default_rng(SEED); ANTITHETIC: each with its reverse), None chooses
    exact up to EXACT_PLAYERS players. BATCH: rows a pass (None: BATCH_TOKENS tokens' worth)."""
    if method not in METHODS:
        raise QkvError(f"unknown forward attribution method {method!r}; choose one of {', '.join(METHODS)}")
    if baseline not in BASELINES:
        raise QkvError(f"unknown baseline {baseline!r}; choose one of {', '.join(BASELINES)}")
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or not 1 <= samples <= MAX_SAMPLES:
        raise QkvError(f"--samples must be a whole number from 1 to {MAX_SAMPLES:,}, got {samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise QkvError(f"--seed must be a whole number ≥ 0, got {seed!r}")
    if getattr(model.config, "encoder_decoder", False):
        raise QkvError("occlusion and Shapley values read one stack's tokens; for an encoder–decoder use "
                       "--method saliency, grad-x-input or ig")
    ids = model.encode(text_or_ids)[0] if isinstance(text_or_ids, str) else model.check_ids(text_or_ids)[0][0]
    ids = np.asarray(ids, np.int64)                                          # (n,)
    n = len(ids)
    labels = [model.tokenizer.label(int(i)) if model.tokenizer else str(int(i)) for i in ids]
    players = player_spans(labels, spans, keep_first)
    p = len(players)
    if exact is None:
        exact = p <= EXACT_PLAYERS
    if method == "shapley" and exact and p > MAX_EXACT_PLAYERS:
        raise QkvError(f"exact Shapley values of {p} players need 2^{p} passes; use sampling (leave out --exact) or "
                       f"group the tokens (--spans words), at most {MAX_EXACT_PLAYERS} players")
    out, what = output_of(model, ids, target, other, compare)
    rows = np.asarray(model.weights.tok_embed[ids[None]], np.float32)        # (1, n, d) E[ids]
    if model.config.embed_scale is not None:
        rows = rows * np.float32(model.config.embed_scale)                   # e = E[ids]·s
    base, base_name = baseline_rows(model, rows, baseline)                   # (1, n, d)
    members = np.zeros((p, n), bool)                                         # (p, n) player j holds position i
    for j, span in enumerate(players):
        members[j, span] = True
    per = batch or max(1, BATCH_TOKENS // n)
    game = _Game(lambda points: _z(model, ids[None], points, out), rows, base, members, per)
    label = model.tokenizer.label if model.tokenizer else str
    result = PromptAttribution(labels, [int(i) for i in ids], np.zeros(n), method, out.target, out.other, 0.0,
                               target_label="" if out.target is None else label(out.target), what=what,
                               baseline=base_name + (", first token kept" if keep_first and n > 1 else ""),
                               spans=[list(map(int, s)) for s in players], seed=None)
    if method == "occlusion":
        phi, full, empty = occlusion_values(game)
    elif exact:
        phi, full, empty = exact_shapley(game)
        result.exact = True
    else:
        phi, full, empty = sampled_shapley(game, samples, np.random.default_rng(int(seed)), antithetic)
        result.samples = 2 * -(-samples // 2) if antithetic else samples
        result.seed, result.antithetic = int(seed), antithetic
    result.span_scores, result.logit, result.baseline_logit = phi, full, empty
    result.scores = members.T.astype(np.float64) @ (phi / members.sum(axis=1))   # (n,) a span's share each token
    result.evaluations = game.evaluations
    return result


class _Game:
    """The cooperative game v(S) = z of the text with the players outside S at the baseline: `values(masks
    (m, p) bool)` → (m,) float64, each distinct coalition one row of a batch of PER rows."""

    def __init__(self, z, rows: np.ndarray, base: np.ndarray, members: np.ndarray, per: int):
        self.z, self.rows, self.base, self.members, self.per = z, rows[0], base[0], members, per
        self.players = members.shape[0]
        self.evaluations = 0

    def values(self, masks: np.ndarray) -> np.ndarray:
        """v of each coalition of MASKS (m, p) bool, float64 (m,); each distinct coalition run once."""
        unique, back = np.unique(masks, axis=0, return_inverse=True)         # (u, p), (m,)
        present = (unique[:, :, None] & self.members[None]).any(axis=1)      # (u, n) positions at their tokens
        present |= ~self.members.any(axis=0)[None]                           # a position in no player: itself
        v = np.empty(len(unique))
        for a in range(0, len(unique), self.per):
            keep = present[a:a + self.per, :, None]                          # (b, n, 1)
            points = np.where(keep, self.rows[None], self.base[None]).astype(np.float32)   # (b, n, d)
            v[a:a + self.per] = self.z(points)
        self.evaluations += len(unique)
        return v[back.reshape(-1)]


def occlusion_values(game: _Game) -> tuple[np.ndarray, float, float]:
    """(φ (p,), v(N), v(∅)): φ_i = v(N) − v(N ∖ {i}), the part z loses when player i alone is at the baseline."""
    p = game.players
    masks = np.ones((p + 2, p), bool)                                        # N ∖ {i} for each i, then N, ∅
    masks[np.arange(p), np.arange(p)] = False
    masks[p + 1] = False
    v = game.values(masks)
    return v[p] - v[:p], float(v[p]), float(v[p + 1])


def exact_shapley(game: _Game) -> tuple[np.ndarray, float, float]:
    """(φ (p,), v(N), v(∅)) by enumerating all 2^p coalitions: φ_i = Σ_{S∌i} |S|!(p−|S|−1)!/p! ·
    (v(S ∪ {i}) − v(S)), the coalition S the integer whose bit j says player j is in it."""
    p = game.players
    codes = np.arange(1 << p)                                                # (2^p,)
    masks = (codes[:, None] >> np.arange(p)[None]) & 1 == 1                  # (2^p, p)
    v = game.values(masks)                                                   # (2^p,)
    size = masks.sum(axis=1)                                                 # |S|
    weight = np.array([math.factorial(k) * math.factorial(p - k - 1) / math.factorial(p) for k in range(p)])
    phi = np.empty(p)
    for i in range(p):
        without = codes[(codes >> i) & 1 == 0]                               # the 2^(p−1) coalitions without i
        phi[i] = weight[size[without]] @ (v[without | (1 << i)] - v[without])
    full, empty = float(v[-1]), float(v[0])
    _check_efficiency(phi.sum(), full - empty, "exact enumeration")
    return phi, full, empty


def sampled_shapley(game: _Game, samples: int, rng: np.random.Generator,
                    antithetic: bool = True) -> tuple[np.ndarray, float, float]:
    """(φ (p,), v(N), v(∅)): the mean over SAMPLES permutations π (ANTITHETIC: ⌈SAMPLES/2⌉ and their reverses)
    of each player's marginal v(π before i, and i) − v(π before i); all prefixes of all permutations are
    rows of the same batches."""
    p = game.players
    count = -(-samples // 2) if antithetic else samples
    perms = np.stack([rng.permutation(p) for _ in range(count)])             # (S, p)
    if antithetic:
        perms = np.concatenate([perms, perms[:, ::-1]])                      # (2S, p) each and its reverse
    S = len(perms)
    rank = np.argsort(perms, axis=1)                                         # (S, p) where each player comes
    masks = rank[:, None, :] < np.arange(p + 1)[None, :, None]               # (S, p+1, p) prefix k: the first k
    v = game.values(masks.reshape(-1, p)).reshape(S, p + 1)                  # (S, p+1)
    marginal = np.diff(v, axis=1)                                            # (S, p) the k-th player's marginal
    full, empty = float(v[0, -1]), float(v[0, 0])
    for s in range(S):                                                       # each permutation telescopes
        _check_efficiency(marginal[s].sum(), full - empty, f"permutation {s}")
    phi = np.zeros(p)
    np.add.at(phi, perms.reshape(-1), marginal.reshape(-1))
    phi /= S
    _check_efficiency(phi.sum(), full - empty, "the sampled mean")
    return phi, full, empty


def _check_efficiency(total: float, gap: float, where: str) -> None:
    """Σ φ must be z(x) − z(b) up to float64 rounding; a bug (not the user's mistake) if it is not."""
    if abs(total - gap) > EFFICIENCY * max(1.0, abs(gap)):
        raise AssertionError(f"Shapley efficiency broken in {where}: Σ φ = {total!r}, z(x) − z(b) = {gap!r}")


def player_spans(labels: Sequence[str], spans: str | Sequence[Sequence[int]], keep_first: bool) -> list[list[int]]:
    """The players as lists of positions of the n tokens LABELS (tokenizer labels, "␣Paris"): SPANS "tokens"
    (each one), "words" (a label starting with ␣, ▁ or ↵, or after a ↵, begins a word; WordPiece: each but "##" continuations), explicit
    groups ("0-2,3,5-7" or [[0, 1, 2], [3]]: ranges inclusive, positions in no group stay themselves).
    KEEP_FIRST: position 0 is in no player ("tokens" and "words"; explicit groups are taken as given)."""
    n = len(labels)
    first = 1 if keep_first and n > 1 else 0
    if isinstance(spans, str) and spans == "tokens":
        players = [[i] for i in range(first, n)]
    elif isinstance(spans, str) and spans == "words":
        spaced = any(t.startswith(SPACES) for t in labels[1:])              # byte-level, SentencePiece
        players = []
        for i in range(first, n):
            starts = (labels[i].startswith(SPACES) or labels[i - 1].endswith("↵")) if spaced else \
                not labels[i].startswith("##")                               # WordPiece: "##" continues a word
            if starts or not players:
                players.append([i])
            else:
                players[-1].append(i)
    else:
        players = _groups(spans, n)
    if not players:
        raise QkvError("nothing to attribute: --spans names no group of positions; give 'tokens', 'words' or "
                       "groups like '1-3,4'")
    return players


def _groups(spans: str | Sequence[Sequence[int]], n: int) -> list[list[int]]:
    """Explicit groups of positions: "0-2,3,5-7" (inclusive ranges) or a list of lists; each position in at
    most one group, all within 0..n−1."""
    if isinstance(spans, str):
        groups = []
        for part in (s.strip() for s in spans.split(",")):
            a, _, b = part.partition("-")
            if not a.strip().isdigit() or (b and not b.strip().isdigit()):
                raise QkvError(f"--spans takes 'tokens', 'words' or groups of positions like '0-2,3,5-7'; got {spans!r}")
            lo, hi = int(a), int(b) if b else int(a)
            if hi < lo:
                raise QkvError(f"--spans: the range {part!r} ends before it starts")
            groups.append(list(range(lo, hi + 1)))
    else:
        groups = [[int(i) for i in g] for g in spans]
    seen: set[int] = set()
    for g in groups:
        if not g or min(g) < 0 or max(g) >= n:
            raise QkvError(f"--spans: a group of positions must lie within 0..{n - 1} (the text has {n} tokens)")
        if seen & set(g):
            raise QkvError(f"--spans: position {min(seen & set(g))} is in two groups; each position in one at most")
        seen |= set(g)
    return groups
