"""The pictures of docs/guide.md (and guide.ko.md), made by qkv's own commands.

    .venv/bin/python docs/make_guide_figures.py        # writes docs/images/guide/*.png

Run from anywhere: each command runs in the repository's top folder, so a model given by its path is named by that
relative path in the figure (never by a path of the machine that drew it).

    linear_smollm2.png   qkv explain linear --out DIR                     (guide: linear)  SmolLM2, shipped
    sound_tiny.png       qkv show tone.wav --model tests/fixtures/whisper/tiny --out DIR  (words.png; guide: audio)
    proteins_tiny.png    qkv explain proteins --model tests/fixtures/models/esm --out DIR  (guide: proteins)

tone.wav is the sound the guide writes with its one-line command (a 440 Hz tone for 0.5 s of 1 s). The last two
run on the repository's tiny random checkpoints: the guide says so, and shows them for their layout. Each PNG is
reduced to at most WIDTH pixels across and 256 colours, so the pictures stay small.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "guide"
WIDTH = 1100                    # pixels across, at most
RATE = 16_000                   # the tone's sample rate (Whisper's)


def qkv(*args: str) -> None:
    """Run one qkv command in the repository's top folder; stop if it fails."""
    print("qkv", " ".join(args))
    subprocess.run([sys.executable, "-m", "qkv", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def tone(path: Path) -> None:
    """The guide's tone.wav: 0.3·sin(2π·440·t) for t < 0.5 s, then silence, 1 s at 16 kHz."""
    t = np.arange(RATE) / RATE                                             # (16000,) seconds
    sf.write(path, 0.3 * np.sin(2 * np.pi * 440 * t) * (t < 0.5), RATE)


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

        tone(tmp / "tone.wav")
        qkv("show", str(tmp / "tone.wav"), "--model", "tests/fixtures/whisper/tiny", "--out", str(tmp / "sound"))
        small(tmp / "sound" / "words.png", "sound_tiny.png")

        qkv("explain", "proteins", "--model", "tests/fixtures/models/esm", "--out", str(tmp / "proteins"))
        small(tmp / "proteins" / "proteins.png", "proteins_tiny.png")


if __name__ == "__main__":
    main()
