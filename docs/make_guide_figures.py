"""The pictures of docs/guide.md (and guide.ko.md), made by qkv's own commands.

    .venv/bin/python docs/make_guide_figures.py        # writes docs/images/guide/*.png

Run from anywhere: each command runs in the repository's top folder, so a model given by its path is named by that
relative path in the figure (never by a path of the machine that drew it).

    linear_smollm2.png   qkv explain linear --out DIR                     (guide: linear)  SmolLM2, shipped
    sound_digits.png     qkv show four-nine-four.wav --model digits-whisper --out DIR  (words.png; guide: audio)
    proteins_tiny.png    qkv explain proteins --model tests/fixtures/models/esm --out DIR  (guide: proteins)

four-nine-four.wav is one of digits-whisper's shipped examples (copied first, so the figure names it alone). The
last one runs on the repository's tiny random ESM-2: the guide says so, and shows it for its layout. Each PNG is
reduced to at most WIDTH pixels across and 256 colours, so the pictures stay small.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from qkv.checkpoints import speech_dir

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "guide"
WIDTH = 1100                    # pixels across, at most


def qkv(*args: str) -> None:
    """Run one qkv command in the repository's top folder; stop if it fails."""
    print("qkv", " ".join(args))
    subprocess.run([sys.executable, "-m", "qkv", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def small(src: Path, name: str) -> None:
    """SRC as OUT/NAME: at most WIDTH pixels across, 256 colours."""
    img = Image.open(src).convert("RGB")
    if img.width > WIDTH:
        img = img.resize((WIDTH, round(img.height * WIDTH / img.width)), Image.LANCZOS)
    path = OUT / name
    img.quantize(colors=256).save(path, optimize=True)
    print(f"{path.relative_to(ROOT)}  {path.stat().st_size / 1024:.0f} KB")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        qkv("explain", "linear", "--out", str(tmp / "linear"))
        small(tmp / "linear" / "linear.png", "linear_smollm2.png")

        shutil.copy(speech_dir() / "four-nine-four.wav", tmp / "four-nine-four.wav")
        qkv("show", str(tmp / "four-nine-four.wav"), "--model", "digits-whisper", "--out", str(tmp / "sound"))
        small(tmp / "sound" / "words.png", "sound_digits.png")

        qkv("explain", "proteins", "--model", "tests/fixtures/models/esm", "--out", str(tmp / "proteins"))
        small(tmp / "proteins" / "proteins.png", "proteins_tiny.png")


if __name__ == "__main__":
    main()
