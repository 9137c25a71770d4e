"""Benchmarks: qkv against transformers, measured in one run, written to docs/benchmarks.md.

    forward, generate, llm, attention, heads
                one module per benchmark: `measure` → a plain dict → `markdown` (attention's
                section and figure in attention_report; llama_cpp runs llama.cpp beside llm)
    common      interleaved timing, the machine's facts, the docs-section writer
    decoding    what the two generation benchmarks share: bandwidths, the bandwidth share
    markdown    the pieces of every report: tables, the machine line, background labels
    cli         the `qkv bench ...` commands

Every sentence of a report comes from its run's dict, or is labelled background
(`markdown.background`). torch and transformers are imported only inside the
measurements, so importing this package never needs them.
"""
