"""The generate benchmark as a script: `python benchmarks/generate.py [--out docs/benchmarks.md]`.

The same code as `qkv bench generate` (src/qkv/bench/cli.py); takes the same options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))   # run from a checkout

from qkv.cli.bench import generate_command as command  # noqa: E402
from qkv.cli.common import run  # noqa: E402

if __name__ == "__main__":
    run(command, prog_name="benchmarks/generate.py")
