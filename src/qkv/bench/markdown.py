"""The pieces every benchmark's docs section is built from: tables, the machine, the command.

A report states what its run measured. A sentence that is not from the run (why a number is
what it is, a finding of an earlier run) goes through `background`, which labels it so.
"""

from __future__ import annotations

from .common import OPENBLAS_VARS

MET = {True: "met", False: "not met"}


def table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    """A Markdown table: `align` has one letter per column, l (left) or r (right)."""
    rule = {"l": "---", "r": "---:"}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def background(text: str) -> str:
    """A sentence that does not come from this run, labelled as such."""
    return f"*Background, not measured in this run:* {text}"


def target(what: str, value: float, goal: float, shown: str) -> str:
    """'what (here shown: met)' for value ≥ goal."""
    return f"{what} (here {shown}: {MET[value >= goal]})"


def openblas_env(mach: dict) -> str:
    """OPENBLAS_CORETYPE=…, OPENBLAS_L2_SIZE=… as the run saw them ('unset' when absent)."""
    return ", ".join(f"{k}={mach['env'][k] if mach['env'][k] is not None else 'unset'}" for k in OPENBLAS_VARS)


def blas(mach: dict, threads_note: str = "") -> str:
    """'openblas 0.3.31 (kernel Haswell, 2 threads…)' for NumPy's BLAS."""
    b = mach["blas"]
    return (f"{b.get('internal_api')} {b.get('version') or ''} (kernel {b.get('architecture')}, "
            f"{b.get('num_threads')} threads{threads_note})")


def numpy_blas(mach: dict, threads_note: str = "") -> str:
    """'Python 3.11.7; NumPy 2.4 with openblas … (…)', and qkv's measured choices when the run recorded them."""
    text = f"Python {mach['python']}; NumPy {mach['numpy']} with {blas(mach, threads_note)}"
    return text + (f"; {tuned(mach['tuned'])}" if mach.get("tuned") else "")


def tuned(t: dict) -> str:
    """The choices qkv.runtime.tuning made on this machine, as a report names them."""
    return (f"qkv's choices for this machine (qkv.runtime.tuning, {t.get('source', 'measured')}): one-token steps "
            f"fastest on {t['decode']} BLAS thread(s) when measured (generation still times 1 against 2 or more), "
            f"a prompt's pass on {t['prefill']}, tiled attention on {t['attention']} worker(s) with "
            f"{t['q_block']} × {t['k_block']} blocks")


def cpu(mach: dict) -> str:
    """'AMD EPYC, 2 cores, vector extensions avx2, avx512f, …' (the extensions when the run recorded them)."""
    vector = mach.get("vector")
    return f"{mach['cpu']}, {mach['cores']} cores" + (f", vector extensions {', '.join(vector)}" if vector else "")


def torch_machine(result: dict, libraries: str = "") -> str:
    """The machine line of a report timed beside torch (train, patch): CPU and its vector extensions,
    NumPy's BLAS and qkv's choices, torch's threads and kernels, transformers (+ `libraries`), the
    OpenBLAS variables, the other processes' load."""
    mach, torch_ = result["machine"], result["machine"]["torch"]
    return (f"Machine: {mach['cpu']}, {mach['cores']} cores, vector extensions "
            f"{', '.join(mach.get('vector') or ['unknown'])}; {numpy_blas(mach)}; torch {torch_['version']} "
            f"({torch_['threads']} threads, {torch_['capability']} kernels), transformers {mach['transformers']}"
            f"{libraries}; {openblas_env(mach)}. {busy(result['others_cores'])}")


def cores(x: float | None) -> str:
    return "an unknown number of cores" if x is None else f"{x:.2f} cores"


def busy(x: float | None) -> str:
    """The sentence on other processes' load during the timing (cpu_snapshot / others_cores)."""
    return f"Other processes kept {cores(x)} busy on average during the timing."


def reproduce(command: str, what: str = "this section") -> list[str]:
    return ["Reproduce (rewrites only " + what + "):", "", "```sh", command, "```"]


def join(*paragraphs: str | list[str] | None) -> str:
    """Paragraphs (a string, or a list of lines kept together) separated by blank lines; None skipped."""
    lines: list[str] = []
    for p in paragraphs:
        if p is None or p == []:
            continue
        if lines:
            lines.append("")
        lines += [p] if isinstance(p, str) else p
    return "\n".join(lines)
