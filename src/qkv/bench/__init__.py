"""Benchmarks: qkv against transformers, measured in one run, written to docs/benchmarks.md.

`qkv bench forward` (cli.py) runs `forward.measure`; `common` holds the shared timing,
machine facts and markdown-section writer. torch and transformers are imported only
inside the measurements, so importing this package never needs them.
"""
