"""The forward benchmark as a script: `python benchmarks/forward.py [--out docs/benchmarks.md]`.

The same code as `qkv bench forward` (src/qkv/bench/forward.py); takes the same options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))   # run from a checkout

import click  # noqa: E402

from qkv.bench.cli import forward  # noqa: E402
from qkv.errors import QkvError  # noqa: E402

if __name__ == "__main__":
    try:
        forward.main(prog_name="benchmarks/forward.py", standalone_mode=False)
    except QkvError as e:                      # a missing reference stack: one line, exit 2
        click.echo(f"qkv: error: {e}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
