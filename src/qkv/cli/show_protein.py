"""`qkv show SEQUENCE --model ESM`: beside each residue's attention, the contact map ESM's contact head predicts from
every head (qkv.analysis.contacts): the pairs it is surest of, and the single heads whose map best matches it. With
--out, the viewer opens on its Contacts tab, which draws them (`analysis.sections.contact_payload`,
`viz.contact_panel`): the map beside the chosen head's own map and attention, the best heads listed."""

from __future__ import annotations

import click

SHOWN = 5                              # the surest pairs and the best heads printed


def print_contacts(model, text: str) -> None:
    """The contact map of TEXT (a protein's sequence) through MODEL, in two lines; the lesson's page in full:
    `qkv explain proteins SEQUENCE --model DIR`."""
    from ..analysis.contacts import contacts

    cm = contacts(model, text)
    pairs = ", ".join(f"{i + 1}{cm.residues[i]}–{j + 1}{cm.residues[j]} {p:.2f}" for i, j, p in cm.top_contacts(SHOWN))
    heads = ", ".join(f"L{layer}.H{head} r {r:+.2f}" for layer, head, r in cm.best_heads(SHOWN))
    click.echo(f"contacts (ESM's contact head over every head's attention; pairs |i − j| ≥ {cm.separation}, "
               f"all pairs when none is that far): {pairs or '—'}")
    click.echo(f"heads whose symmetrised, APC-corrected map best matches it: {heads}  (qkv explain proteins; with "
               "--out, the viewer's Contacts tab)")


def first_view(sections: dict) -> str | None:
    """The view `qkv show --out` opens the viewer on: the Contacts tab when SECTIONS hold a contact map (a protein
    model's, what it is shown for), else None (the viewer's own first view, the Head view)."""
    return "contacts" if sections.get("contacts") is not None else None
