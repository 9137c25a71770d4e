"""A role for each head, from its statistics, with the thresholds written down.

The rules, tried in this order (the first that holds names the head):

  induction     induction score ≥ INDUCTION (0.4) on repeated random tokens
  previous, next, self, [CLS], [SEP], punctuation
                the largest of prev, next, self, cls, sep, punct is ≥ DOMINANT (0.5):
                on average more than half of each token's attention goes to that one target
  first         (tokenizers without [CLS] only, i.e. decoders) first ≥ DOMINANT: the sink
  broad         entropy ≥ BROAD (0.75) × the entropy of evenly spread attention over the
                same texts: the head looks everywhere (Clark et al.'s "broad" heads)
  mixed         none of the above

With [CLS] at position 0 (BERT), `first` equals `cls`, so the role is "[CLS]" there.
"""

from __future__ import annotations

import numpy as np

DOMINANT = 0.5
BROAD = 0.75
INDUCTION = 0.4

# statistic → the role it names, in the order ties are broken
TARGETS = {"prev": "previous", "next": "next", "self": "self", "cls": "[CLS]", "sep": "[SEP]",
           "punct": "punctuation"}
ROLES = ("induction", *TARGETS.values(), "first", "broad", "mixed")
THRESHOLDS = {"dominant": DOMINANT, "broad": BROAD, "induction": INDUCTION}


def classify(stats: dict[str, np.ndarray | None], uniform_entropy: float,
             induction: np.ndarray | None = None) -> list[list[str]]:
    """L × H role names from L × H statistics (None = not applicable) and induction scores."""
    L, H = np.shape(stats["entropy"])
    targets = {name: stats[name] for name in TARGETS if stats.get(name) is not None}
    if stats.get("cls") is None and stats.get("first") is not None:
        targets["first"] = stats["first"]
    roles = []
    for layer in range(L):
        row = []
        for head in range(H):
            row.append(_role(layer, head, targets, stats["entropy"], uniform_entropy, induction))
        roles.append(row)
    return roles


def _role(layer: int, head: int, targets: dict, entropy: np.ndarray, uniform: float,
          induction: np.ndarray | None) -> str:
    if induction is not None and induction[layer, head] >= INDUCTION:
        return "induction"
    name, value = max(((n, float(v[layer, head])) for n, v in targets.items()), key=lambda nv: nv[1])
    if value >= DOMINANT:
        return TARGETS.get(name, name)
    if uniform > 0 and entropy[layer, head] >= BROAD * uniform:
        return "broad"
    return "mixed"


def strength(role: str, layer: int, head: int, stats: dict, uniform_entropy: float,
             induction: np.ndarray | None = None) -> float | None:
    """The number behind a role: the statistic that named it (broad: entropy / uniform entropy)."""
    if role == "induction" and induction is not None:
        return float(induction[layer, head])
    if role == "broad":
        return float(stats["entropy"][layer, head] / uniform_entropy) if uniform_entropy > 0 else None
    by_role = {r: s for s, r in TARGETS.items()} | {"first": "first"}
    if role in by_role and stats.get(by_role[role]) is not None:
        return float(stats[by_role[role]][layer, head])
    return None
