"""`qkv transcribe FILE --model WHISPER [--language ko] [--task translate] [--timestamps] [--words]`: Whisper writes
what it hears.

FILE is a sound (WAV, FLAC, OGG: read, made mono, resampled to 16 kHz, turned into log-mel features as
transformers' WhisperFeatureExtractor makes them; qkv.inputs.audio) or an .npy file of log-mel features. The
transcript is written greedily under the checkpoint's generation_config.json (qkv.writing.transcribe): ids equal to
transformers' generate(num_beams=1). Without --language, the language is detected and its probabilities printed.
--words prints each word's span of sound (qkv.writing.timestamps: DTW over the alignment heads' cross-attention).
"""

from __future__ import annotations

import click

from ..runtime.errors import QkvError
from .options import model_option

TOP_LANGUAGES = 5               # how many detected languages are printed


@click.command(name="transcribe")
@click.argument("file", metavar="FILE")
@model_option(None, "A Whisper checkpoint: a local Hugging Face directory (WhisperForConditionalGeneration with its "
                    "generation_config.json and tokenizer.json).")
@click.option("--language", "-l", default=None, metavar="CODE",
              help="The spoken language's code (en, ko, …).  [default: detected from the first 30 s]")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default=None,
              help="transcribe (in the language spoken) or translate (into English).  [default: the checkpoint's]")
@click.option("--timestamps", is_flag=True, default=False,
              help="Write Whisper's timestamp tokens and print each segment's start and end (always on past 30 s).")
@click.option("--max-new-tokens", "-n", type=int, default=None,
              help="At most this many tokens per 30 s window.  [default: the generation config's max_length]")
@click.option("--ids", "show_ids", is_flag=True, default=False, help="Also print the written token ids.")
@click.option("--words", "show_words", is_flag=True, default=False,
              help="Also print each word with the span of sound where it was heard (dynamic time warping over the "
                   "alignment heads' cross-attention, as transformers' return_token_timestamps).")
def transcribe_cmd(file: str, source: str | None, language: str | None, task: str | None, timestamps: bool,
                   max_new_tokens: int | None, show_ids: bool, show_words: bool) -> None:
    """Transcribe (or translate) the sound in FILE with a Whisper checkpoint.

    The encoder reads 30 s of log-mel frames at a time; the decoder writes after its prompt of start, language,
    task (and no-timestamps) tokens, one token at a time through its KV cache, under Whisper's rules (suppressed
    tokens, timestamps in pairs). Longer sounds are written window by window, as transformers' long-form generate.
    """
    from .common import load_model as load
    from ..models.audio_model import AudioModel

    if source is None:
        raise QkvError("give the Whisper checkpoint with --model DIRECTORY")
    model = load(source)
    if not isinstance(model, AudioModel):
        raise QkvError(f"{model.name} is not Whisper ({model.config.family}): qkv transcribe reads sound with a "
                       "Whisper checkpoint")
    from .show_audio import shipped_example

    features = _features(shipped_example(model, file), model)
    result = model.transcribe(features, language=language, task=task, timestamps=True if timestamps else None,
                              max_new_tokens=max_new_tokens)
    if result.language_probs is not None:
        top = list(result.language_probs.items())[:TOP_LANGUAGES]
        click.echo("language (detected): " + ", ".join(f"{k.strip('<|>')} {p:.2f}" for k, p in top))
    if result.text is None:
        click.echo(f"{model.name} has no tokenizer.json: the written ids are")
        click.echo(" ".join(map(str, result.ids.tolist())))
        return
    if timestamps or len(result.windows) > 1:
        for s in result.segments:
            click.echo(f"[{s.start:7.2f} → {s.end:7.2f}] {s.text.strip()}")
    else:
        click.echo(result.text.strip())
    if show_ids:
        click.echo("ids: " + " ".join(map(str, result.ids.tolist())))
    if show_words:
        for w in result.words:
            click.echo(f"{w.start:7.2f} → {w.end:7.2f}  {w.word.strip()}")


def _features(file: str, model):
    """FILE's log-mel features (mels, frames): an .npy of them or a sound (cli/show_audio.features_of)."""
    from .show_audio import features_of

    return features_of(file, model)
