"""`qkv show FEATURES.npy|SOUND --model WHISPER [--prefix TEXT]`: where each word of a transcript looks in the sound.

FEATURES.npy holds the log-mel features of one sound (mels × frames, float, what WhisperFeatureExtractor gives for
one input); the encoder reads them through its convolutions (20 ms per position), the decoder reads the transcript
(--prefix), and the cross-attention of each text token over the frames is printed for one decoder layer and, with
--out, drawn (the encoder–decoder's heatmaps and viewer, whose source tokens are the times "0.00s", "0.02s", …).
FILE may also be a sound file (WAV, FLAC, OGG: its first 30 s). Without --prefix, a checkpoint with a
generation_config.json writes the transcript itself (`show_words`): each word is printed with the span its word
timestamp gives (qkv.writing.timestamps) and, with --out, words.png draws the log-mel spectrogram with each word's
alignment-head attention over time under it.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import click
import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import open_regular
from .common import check_writable, head_pairs, removed_if_failed

MAX_BYTES = 64 << 20            # a features file larger than this is refused before it is read


def read_features(path: str, want: tuple[int, int] | None = None) -> np.ndarray:
    """An .npy file of log-mel features (mels, frames) or (1, mels, frames), floats, no pickles: one QkvError
    naming what is wrong. Its header is read first: a shape other than WANT (the model's (mels, frames)), or data
    the file does not hold, is refused before an array is made (a header declaring (6, 10¹²) allocates nothing)."""
    try:
        with open_regular(path, MAX_BYTES) as f:
            _check_header(f, path, want)
            x = np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise QkvError(f"no features file {path}; give an .npy file of log-mel features (mels × frames)") from None
    except OSError as e:
        raise QkvError(f"cannot read {path}: {e.strerror or e}; give a regular .npy file of at most "
                       f"{MAX_BYTES >> 20} MB") from None
    except ValueError as e:
        raise QkvError(f"{path} is not an .npy array of numbers ({str(e)[:60]}); save the features with numpy.save") from None
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or x.ndim not in (2, 3) or (x.ndim == 3 and len(x) != 1):
        raise QkvError(f"{path} holds {getattr(x, 'dtype', '?')} {getattr(x, 'shape', '?')}; give the log-mel features of "
                       "one sound, floats of shape (mels, frames)")
    return x.reshape(x.shape[-2:])


def _check_header(f, path: str, want: tuple[int, int] | None) -> None:
    """The .npy header in F (open at its start; left there again): a float dtype, a shape (mels, frames) or
    (1, mels, frames) equal to WANT when given, and data bytes the file holds. ValueError for a header numpy cannot
    read (np.load says what); QkvError naming the shape for the rest."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    data = f.tell()
    f.seek(0)
    if dtype.hasobject:
        return                                          # pickled objects: np.load refuses them (allow_pickle=False)
    expected = "(mels, frames)" if want is None else f"(mels, frames) = ({want[0]}, {want[1]})"
    if dtype.kind != "f" or len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != 1) or (
            want is not None and tuple(shape[-2:]) != tuple(want)):
        raise QkvError(f"{path} declares {dtype} {tuple(shape)}; the model reads floats of shape {expected}: give "
                       "the log-mel features of one sound, padded or cut to that many frames")
    size, need = os.fstat(f.fileno()).st_size, data + math.prod(shape) * dtype.itemsize
    if size < need:
        raise QkvError(f"{path} declares {dtype} {tuple(shape)}, {need - data:,} bytes of data, but holds "
                       f"{max(size - data, 0):,}; save the features again with numpy.save")


def shipped_example(model, path: str) -> str:
    """PATH, or — when MODEL is digits-whisper and PATH is the bare name of one of its shipped example WAVs that is not
    a file here — that example inside qkv (said on stderr), as `qkv show 7 --model digits-vit` reads its digit."""
    from ..checkpoints import SPEECH, speech_dir

    if model.name != SPEECH or os.path.exists(path) or Path(path).name != path or not path.lower().endswith(".wav"):
        return path
    example = speech_dir() / path
    if not example.is_file():
        return path
    click.echo(f"(the example shipped with {SPEECH}: {example})", err=True)
    return str(example)


def show_audio(model, path: str, target: str | None, layer: int | None, head: int | None, out_dir: str | None,
               ablate: tuple[str, ...]) -> None:
    """`qkv show` on Whisper: the transcript's cross-attention over the frames (see the module docstring)."""
    from ..viz.figures import focused_head
    from ..viz.seq2seq import cross_written
    from .tables import print_cross

    path = shipped_example(model, path)
    if ablate:                                                       # its passes run ablated
        model = model.ablate(head_pairs(ablate))
    if target is None and _writes(model):
        return show_words(model, path, layer, head, out_dir)
    if target is None:
        raise QkvError(f"give the transcript with --prefix TEXT (`qkv transcribe SOUND --model {model.name}` writes "
                       "one)")
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json to read --prefix with; add the checkpoint's tokenizer.json")
    layer = model.check_layer(-1 if layer is None else layer)
    if head is not None:
        head = model.check_head(head)
    if Path(path).suffix.lower() == ".npy":
        features = read_features(path, (model.config.audio_mels, 2 * model.config.source_positions))
    else:                                                            # a sound: its first 30 s window
        from ..inputs.audio import sound_features

        features = sound_features(path, model.config.audio_mels)[0][:, :2 * model.config.source_positions]
    model.check_features(features)                                   # the model's mels and frames, finite
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        trace = model.run(features, target)
        trace.encoder.text = Path(path).name
        cross = cross_written(trace, model.tokenizer)
        print_cross(trace, cross, model, layer, head, translated=False)
        if out_dir is not None:
            picked = focused_head(cross, layer) if head is None else head
            files = _save(trace, out_dir, model, layer, picked)
    if out_dir is not None:
        click.echo(f"wrote {len(files)} files to {out_dir} (cross-attention heatmap of head {picked}, decoder layer {layer}):")
        for f in files:
            click.echo(f"  {f}")
        click.echo(f"open {files[0]} in a browser: encoder, decoder and cross-attention (text over time), every layer "
                   "and head")


def _save(trace, out_dir: str, model, layer: int, head: int) -> list[Path]:
    """The viewer (encoder / decoder / cross views) and the heatmaps into OUT_DIR, all or nothing."""
    from ..runtime.io import FileBatch
    from ..viz.html import viewer_html
    from ..viz.seq2seq import save_seq2seq_figures

    out = Path(out_dir)
    try:
        with FileBatch(out) as files:
            files.write_text("attention.html", viewer_html(trace, tokenizer=model.tokenizer))
            save_seq2seq_figures(trace, files, layer=layer, head=head, tokenizer=model.tokenizer)
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror or e}; choose a writable directory") from None
    return files.paths


def features_of(file: str, model) -> np.ndarray:
    """FILE's log-mel features (mels, frames): an .npy of them (checked as read_features checks them, any number
    of frames) or a sound file (qkv.inputs.audio: mono, 16 kHz, WhisperFeatureExtractor's features)."""
    if file.lower().endswith(".npy"):
        x = read_features(file)
        if x.shape[0] != model.config.audio_mels:
            raise QkvError(f"{file} holds {x.shape[0]} mel bins but {model.name} reads {model.config.audio_mels}; "
                           "give features made for this checkpoint")
        return x
    from ..inputs.audio import sound_features

    return sound_features(file, model.config.audio_mels, model.window_samples)[0]


# ── no transcript given: Whisper writes one, and each word is placed in time ────

def _writes(model) -> bool:
    """Whether MODEL can write its own transcript: a checkpoint folder with a generation_config.json."""
    return model.directory is not None and (Path(model.directory) / "generation_config.json").is_file()


def show_words(model, path: str, layer: int | None, head: int | None, out_dir: str | None) -> None:
    """`qkv show SOUND --model WHISPER` without --prefix: transcribe SOUND (a sound file or an .npy of log-mel
    features), print each word with its span and where its alignment heads look most, and with --out draw the
    spectrogram with each word's attention over time under it (words.png, .svg), words.html (click a word to hear
    it), the viewer of the first window (attention.html) and the cross-attention heatmap of one head of LAYER."""
    from ..writing.timestamps import word_attention

    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json to read its transcript with; add the checkpoint's "
                       "tokenizer.json")
    layer = model.check_layer(-1 if layer is None else layer)
    if head is not None:
        head = model.check_head(head)
    sound = None
    if path.lower().endswith(".npy"):
        features = features_of(path, model)                          # (mels, T)
    else:
        from ..inputs.audio import sound_features

        features, sound = sound_features(path, model.config.audio_mels, model.window_samples)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        result = model.transcribe(features)
        words = result.words
        attention = word_attention(result)                           # (words, ⌈T/2⌉)
        click.echo(f"transcript: {(result.text or '').strip()}")
        click.echo(f"words ({len(words)}), each with its span and where the alignment heads "
                   f"{', '.join(f'{l}.{h}' for l, h in result.alignments[0].heads)} look most:")
        for w, row in zip(words, attention):
            click.echo(f"  {w.start:7.2f} → {w.end:7.2f}  {w.word.strip():<20} peak {np.argmax(row) * 0.02:.2f}s")
        if out_dir is not None:
            files = _save_words(model, result, words, attention, path, out_dir, layer, head,
                                None if sound is None else sound.samples)
    if out_dir is not None:
        click.echo(f"wrote {len(files)} files to {out_dir}:")
        for f in files:
            click.echo(f"  {f}")
        click.echo(f"open {Path(out_dir) / 'words.html'} in a browser: the spectrogram, each word's attention over "
                   "time under it; click a word to hear it")


def _save_words(model, result, words, attention, path: str, out_dir: str, layer: int, head: int | None,
                samples: np.ndarray | None) -> list[Path]:
    """words.png / .svg and words.html (the figure, the sound SAMPLES embedded, a button per word), then the first
    window's viewer (attention.html) and the cross-attention heatmap of one head of LAYER (HEAD, or its most
    focused), into OUT_DIR, all or nothing."""
    from ..models.seq2seq import SEQ2SEQ_KEEP
    from ..runtime.io import FileBatch
    from ..viz.audio_words import words_figure, words_page
    from ..viz.drawing import render_figure, save_all
    from ..viz.figures import focused_head, head_heatmap
    from ..viz.html import viewer_html
    from ..viz.seq2seq import CROSS_AXES, cross_written

    trace = result.trace(0, keep=SEQ2SEQ_KEEP)
    trace.encoder.text = Path(path).name
    cross = cross_written(trace, model.tokenizer)
    picked = focused_head(cross, layer) if head is None else head
    figure = words_figure(result.features, words, attention, model_name=model.name, title=Path(path).name)
    png = io.BytesIO()
    render_figure(figure, png, "png")                                # once: the file and the page
    try:
        with FileBatch(Path(out_dir)) as files:
            files.write("words.png", lambda f: f.write(png.getvalue()))
            save_all(files, [("words", lambda: figure)], ("svg",))
            files.write_text("words.html", words_page(png.getvalue(), words, samples,
                                                      title=f"{model.name} · {Path(path).name}"))
            files.write_text("attention.html", viewer_html(trace, tokenizer=model.tokenizer))
            save_all(files, [(f"cross_heatmap_layer{layer}_head{picked}", lambda: head_heatmap(
                cross, layer, picked, model_name=f"{model.name} cross-attention", axes=CROSS_AXES))], ("png",))
    except OSError as e:
        raise QkvError(f"cannot write to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    return files.paths
