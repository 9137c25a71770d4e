"""Where each word was heard, drawn (guide: audio, attention beyond text): the log-mel spectrogram of a sound and,
under it on the same time axis, one row per word of Whisper's transcript — the cross-attention of its alignment heads over time —
with the span its word timestamp gives (qkv.writing.timestamps) outlined.

    words_figure(features, words, attention)     features (mels, T) at 10 ms a frame; words: Word(word, start,
                                                 end, tokens); attention (words, ⌈T / 2⌉) at 20 ms a position
    words_page(figure_png, words, samples)       an offline HTML page: the figure, the sound embedded as a data:
                                                 URL (16-bit WAV), and a button per word that plays its span
                                                 (every text escaped; the words' times are data-* attributes)
"""

from __future__ import annotations

import base64
import html
import io
import wave
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .drawing import drawable, figure_title, fonts, new_figure
from .palette import CMAP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FRAME_SECONDS = 0.01              # one log-mel frame
POSITION_SECONDS = 0.02           # one encoder position (two frames)
SPAN_COLOUR = "#ff5a36"           # the outline of each word's span
MAX_PAGE_SECONDS = 600            # a longer sound is not embedded in the page (16-bit WAV at 16 kHz: 19 MB)
MAX_WORDS = 60                    # rows drawn: the first this many words (the title says how many there are)


def word_label(word, width: int = 18) -> str:
    """A row's label: the word (cut to WIDTH characters) and its span, "hello  0.12–0.40 s"."""
    text = word.word.strip() or "␣"
    text = text if len(text) <= width else text[:width - 1] + "…"
    return drawable(f"{text}  {word.start:.2f}–{word.end:.2f} s")


def words_figure(features: np.ndarray, words: Sequence, attention: np.ndarray, *, model_name: str | None = None,
                 title: str | None = None) -> "Figure":
    """The spectrogram FEATURES (mels, T) above one row per word of ATTENTION (words, P): each word's alignment-head
    attention over time, scaled to its own maximum, its span outlined. Both panels share the time axis (s)."""
    x = np.asarray(features, dtype=np.float64)                                         # (mels, T)
    a = np.asarray(attention, dtype=np.float64)                                        # (words, P)
    if x.ndim != 2 or a.ndim != 2 or len(a) != len(words):
        raise QkvError(f"words_figure needs features (mels, T) and one attention row per word; got {x.shape}, "
                       f"{a.shape} for {len(words)} words")
    seconds = max(x.shape[1] * FRAME_SECONDS, a.shape[1] * POSITION_SECONDS, 1e-3)
    title = title or "where each word was heard"
    if len(words) > MAX_WORDS:
        title = f"{title} (the first {MAX_WORDS} of {len(words)} words)"
        words, a = list(words)[:MAX_WORDS], a[:MAX_WORDS]
    rows = max(len(words), 1)
    fig = new_figure(10.0, 2.6 + 0.28 * rows)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2.2, max(1.0, 0.28 * rows)])
    top.imshow(x, origin="lower", aspect="auto", cmap="magma", interpolation="nearest",
               extent=(0, x.shape[1] * FRAME_SECONDS, 0, x.shape[0]))
    top.set_ylabel("mel bin")
    top.set_title(figure_title(model_name, title), fontsize=11)
    if len(words):
        peak = np.maximum(a.max(axis=1, keepdims=True), 1e-12)
        bottom.imshow(a / peak, aspect="auto", cmap=CMAP, interpolation="nearest", vmin=0, vmax=1,
                      extent=(0, a.shape[1] * POSITION_SECONDS, len(words) - 0.5, -0.5))
        for i, w in enumerate(words):
            bottom.add_patch(_span(w.start, w.end, i))
        bottom.set_yticks(range(len(words)), [word_label(w) for w in words], fontsize=8, family=fonts())
    else:
        bottom.text(0.5, 0.5, "no words written", ha="center", va="center", transform=bottom.transAxes)
        bottom.set_yticks([])
    bottom.set_xlim(0, seconds)
    bottom.set_xlabel("time (s) — each row: a word's alignment-head cross-attention (its own maximum = 1); "
                      "outline: its timestamp span", fontsize=8)
    return fig


def _span(start: float, end: float, row: int):
    from matplotlib.patches import Rectangle

    width = max(end - start, POSITION_SECONDS / 4)                  # a span of 0 s still shows
    return Rectangle((start, row - 0.45), width, 0.9, fill=False, edgecolor=SPAN_COLOUR, linewidth=1.2)


# ── the page ─────────────────────────────────────────────────────────────────────

# No request may leave the page (as the viewer's): inline script and style, the picture and the sound as data: URLs.
PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
            "font-src data:; media-src data:")
PLAY_JS = """
(function () {
  var audio = document.getElementById("qkv-sound"), end = null;
  if (!audio) return;
  audio.addEventListener("timeupdate", function () {
    if (end !== null && audio.currentTime >= end) { audio.pause(); end = null; }
  });
  document.querySelectorAll("button.qkv-word").forEach(function (b) {
    b.addEventListener("click", function () {
      var start = parseFloat(b.dataset.start), stop = parseFloat(b.dataset.end);
      end = Math.max(stop, start + 0.1);
      audio.currentTime = start;
      audio.play();
    });
  });
})();
"""


def wav_bytes(samples: np.ndarray, rate: int = 16_000) -> bytes:
    """Mono samples in [-1, 1] (n,) → a 16-bit PCM WAV file's bytes."""
    pcm = (np.clip(np.asarray(samples, dtype=np.float64), -1, 1) * 32767).round().astype("<i2")   # (n,)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


def words_page(figure_png: bytes, words: Sequence, samples: np.ndarray | None = None, *, rate: int = 16_000,
               title: str = "where each word was heard") -> str:
    """An offline HTML page: FIGURE_PNG (words_figure's), the sound SAMPLES (n,) embedded as a data: URL, and one
    button per word that plays its span [start, end]. Without samples (features given, or a sound longer than
    MAX_PAGE_SECONDS) the buttons only show the spans. Every word and the title are escaped."""
    from .html import page

    picture = base64.b64encode(figure_png).decode("ascii")
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<p><img alt="spectrogram and each word\'s attention over time" style="max-width:100%" '
             f'src="data:image/png;base64,{picture}"></p>']
    if samples is not None and len(samples) <= MAX_PAGE_SECONDS * rate:
        sound = base64.b64encode(wav_bytes(samples, rate)).decode("ascii")
        parts.append(f'<p><audio id="qkv-sound" controls src="data:audio/wav;base64,{sound}"></audio></p>'
                     "<p>Click a word to hear the span its timestamp gives.</p>")
    else:
        why = ("no sound was given (log-mel features)" if samples is None
               else f"the sound is longer than {MAX_PAGE_SECONDS} s")
        parts.append(f"<p>{html.escape(why)}: the spans are shown, not played.</p>")
    buttons = "".join(
        f'<button class="qkv-word" data-start="{float(w.start):.2f}" data-end="{float(w.end):.2f}" '
        f'title="{float(w.start):.2f}–{float(w.end):.2f} s">{html.escape(w.word.strip() or "␣")}</button> '
        for w in words)
    parts.append(f"<p>{buttons}</p>")
    return page(title, "\n".join(parts), [PLAY_JS], csp=PAGE_CSP)
