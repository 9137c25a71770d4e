"""The attention benchmark as a script: `python benchmarks/attention.py [--out docs/benchmarks.md]`.

The same code as `qkv bench attention` (src/qkv/bench/attention.py); takes the same options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))   # run from a checkout

import click  # noqa: E402

from qkv.bench.attention import attention_command  # noqa: E402
from qkv.errors import QkvError  # noqa: E402

if __name__ == "__main__":
    try:
        attention_command.main(prog_name="benchmarks/attention.py", standalone_mode=False)
    except QkvError as e:                      # e.g. a missing reference stack: one line, exit 2
        click.echo(f"qkv: error: {e}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
