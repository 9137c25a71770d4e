"""`qkv models --families`: the table of families — every model_type, the models, what it brings to the engine, what
it runs as (and so which views, analyses, writing and training work), its llama.cpp architectures. Made from the
family modules' own data (ABOUT, GGUF; checkpoints/families.about) and the kinds' commands (checkpoints/table.KINDS),
so it cannot drift from them: `qkv models --families --markdown` prints the table the README holds, word for word.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..checkpoints.families import FamilyRow, about
from ..checkpoints.table import COMMANDS, KINDS, About

# llama.cpp writes Mixtral as arch 'llama' with llama.expert_count; qkv reads it by its 'mixtral' table
# (checkpoints/gguf.mixtral_view): the name a file holds, shown.
WRITTEN_AS = {"mixtral": "`llama` with `expert_count`"}
HEADLESS = ("A checkpoint without the head its kind reads (ELECTRA's discriminator, `ModernBertModel`, `ViTModel`) "
            "refuses what needs the head (`lens`, training) in one line.")
SHOWN = {"experts": "the Experts tab", "gradients": "`qkv.train.gradients`"}   # the rest: `qkv <command>`


def code(name: str) -> str:
    """NAME as the README writes a command or a name: `name`."""
    return SHOWN.get(name, f"`{name}`")


def cell(text: str) -> str:
    """TEXT in a markdown table's cell: a | of its own (|i − j|) escaped, or it would end the cell."""
    return text.replace("|", "\\|")


def gguf_cell(row: FamilyRow) -> str:
    """The row's llama.cpp architectures as a file names them, or — when llama.cpp has none qkv reads."""
    return ", ".join(WRITTEN_AS.get(name, f"`{name}`") for name in row.gguf) or "—"


def kind_cell(row: About) -> str:
    """What the row runs as: its kind, and the commands of the kind its checkpoints refuse (those `when` says)."""
    if not row.refuses:
        return row.kind
    refused = ", ".join(map(code, row.refuses))
    return f"{row.kind}, no {refused}" + (f" when {row.when}" if row.when else "")


def families_markdown() -> str:
    """The README's table of families, then what each kind runs: markdown, a line each."""
    lines = ["| `model_type` | models | what it brings to the engine | runs as | GGUF |", "|---|---|---|---|---|"]
    for row in about():
        a = row.about
        lines.append(f"| {', '.join(f'`{t}`' for t in a.types)} | {cell(a.models)} | {cell(a.brings)} | "
                     f"{kind_cell(a)} | {gguf_cell(row)} |")
    lines += ["", "What each kind runs (`qkv` commands; training: the gradients of every tensor, equal to torch "
                  "autograd):", "", "| runs as | " + " | ".join(COMMANDS) + " |", "|---" * (len(COMMANDS) + 1) + "|"]
    for kind, commands in KINDS.items():
        groups = [" ".join(code(c) for c in group if c in commands) or "—" for group in COMMANDS.values()]
        lines.append(f"| {kind} | " + " | ".join(groups) + " |")
    lines += ["", HEADLESS]
    return "\n".join(lines) + "\n"


def families_terminal() -> tuple[Table, Table, Text]:
    """The terminal's tables: one row per README row (what it brings cut to the line), then the kinds' commands, and
    the note on checkpoints without their head."""
    table = Table(show_edge=False, pad_edge=False, show_lines=False)
    table.add_column("model_type", style="bold")
    table.add_column("models")
    table.add_column("what it brings", max_width=50, no_wrap=True, overflow="ellipsis")   # in full: --markdown
    table.add_column("runs as")
    table.add_column("GGUF")
    for row in about():
        a = row.about
        table.add_row(Text(", ".join(a.types)), Text(a.models), Text(a.brings),
                      Text(kind_cell(a).replace("`", "")), Text(gguf_cell(row).replace("`", "")))
    kinds = Table(show_edge=False, pad_edge=False)
    kinds.add_column("runs as", style="bold")
    for group in COMMANDS:
        kinds.add_column(group)
    for kind, commands in KINDS.items():
        kinds.add_row(kind, *(" ".join(code(c).replace("`", "") for c in group if c in commands) or "—"
                              for group in COMMANDS.values()))
    return table, kinds, Text(HEADLESS.replace("`", ""))
