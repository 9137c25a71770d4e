"""The one grammar of qkv's command line: the options that mean the same thing in every command, each
declared by one helper so that a command states it in one line.

    TEXT        the first argument of every command that reads a text (`text_argument`)
    --model     READER (minilm) where a command looks at how a model reads a text (attention, heads,
                rollout), WRITER (smollm2) where it writes or explains what a model writes next
                (generate, chat, next, lens, dla, attribute, patch, trace-fact, …); TRANSLATOR
                (ko-en-tiny) for translate, which needs an encoder–decoder (`model_option`)
    --token     the token explained or scored; --other the one subtracted from it (`token_option`,
                `other_option`)
    --prefix    an encoder–decoder's target written so far: what its decoder reads after the start
                token, TEXT being the source (`prefix_option`)
    --backend   local | ray (`backend_option`)

A name a command used before this grammar stays one release as a hidden alias (`renamed`): it works,
is not in --help, and says its new name in one line on stderr (so piped output stays clean).
"""

from __future__ import annotations

import functools

import click

from ..analysis.backends import BACKENDS       # local | ray: every command's --backend
from ..checkpoints import DEFAULT, KO_EN, LLM
from ..runtime.errors import QkvError
from .common import GLOBAL_TOKENS, MODEL_HELP

READER = DEFAULT        # "minilm": the default model, for commands about how a model reads a text
WRITER = LLM            # "smollm2": for commands that write text or explain the token a model writes
TRANSLATOR = KO_EN      # "ko-en-tiny": `qkv translate` needs an encoder–decoder


def model_option(default: str | None, help: str = MODEL_HELP):
    """--model SOURCE (the parameter `source`), defaulting to READER, WRITER, TRANSLATOR or None (the
    command's own: a topic's, an SAE's)."""
    return click.option("--model", "source", default=default, show_default=default is not None, metavar="MODEL",
                        help=help)


GLOBAL_HELP = ("Longformer: the positions (from 0) that attend globally, reading every key with their own Q, K, V "
               "(transformers' global_attention_mask)  [default: none, as LongformerForMaskedLM]; refused for a model "
               "without global attention.")


def global_tokens_option():
    """--global-tokens I,J,…: Longformer's global tokens for every model the command loads (common.load_model reads
    them from the command's click context and applies common.with_global_tokens: a model without global attention
    is refused in one line). No parameter: the command's code is unchanged."""
    def keep(ctx: click.Context, param, value: str | None) -> str | None:
        if value is not None:
            ctx.meta[GLOBAL_TOKENS] = value
        return value

    return click.option("--global-tokens", default=None, metavar="I,J,…", expose_value=False, callback=keep,
                        help=GLOBAL_HELP)


def text_argument(required: bool = True):
    """TEXT, the command's first argument (the parameter `text`)."""
    return click.argument("text", metavar="TEXT" if required else "[TEXT]", required=required)


def token_option(help: str, was: str | None = None):
    """--token TOKEN (the parameter `token`): the token explained or scored; WAS its old name, hidden."""
    return _with_alias(click.option("--token", "token", default=None, metavar="TOKEN", help=help), was, "--token",
                       "token")


def other_option(help: str, was: str | None = None):
    """--other TOKEN (the parameter `other`): the token whose logit is subtracted from --token's."""
    return _with_alias(click.option("--other", "other", default=None, metavar="TOKEN", help=help), was, "--other",
                       "other")


PREFIX_HELP = ("Encoder–decoders (ko-en-tiny, Marian, BART, mBART, Pegasus, T5, mT5): the target written so far, "
               "which the decoder reads after its start token; TEXT is the source.")


def prefix_option(default_help: str, was: str | None = None):
    """--prefix TEXT (the parameter `prefix`): an encoder–decoder's target so far; DEFAULT_HELP says what
    the command reads without it."""
    return _with_alias(click.option("--prefix", "prefix", default=None, metavar="PREFIX",
                                    help=f"{PREFIX_HELP} {default_help}"), was, "--prefix", "prefix")


def backend_option(help: str, default: str = "local", was: str | None = None,
                   values: dict[bool, str] | None = None):
    """--backend local|ray (the parameter `backend`); WAS an old on/off flag ("--ray/--no-ray") whose two
    values VALUES maps to backends."""
    option = click.option("--backend", "backend", type=click.Choice(BACKENDS), default=default, show_default=True,
                          help=help)
    return _with_alias(option, was, "--backend", "backend", values)


def _with_alias(option, was: str | None, new: str, dest: str, values: dict | None = None):
    """OPTION, and the hidden alias WAS beside it when the command had one."""
    if was is None:
        return option
    return lambda f: renamed(was, new, dest, values)(option(f))


def renamed(old: str, new: str, dest: str, values: dict | None = None):
    """A hidden option OLD that still works one release: its value goes to the parameter DEST (NEW on
    the command line, an option or TEXT), with one line on stderr naming NEW. VALUES maps an on/off
    flag's value ("--ray/--no-ray") to NEW's (True → "ray"). OLD and NEW together are one error."""
    hidden = f"_was_{dest}"
    flag = "/" in old

    def decorate(f):
        @functools.wraps(f)
        def command(*args, **kwargs):
            value = kwargs.pop(hidden)
            if value is not None:
                used = old.split("/")[0 if value else 1] if flag else old
                said = new if values is None else f"{new} {values[value]}"
                source = click.get_current_context().get_parameter_source(dest)
                if source is click.core.ParameterSource.COMMANDLINE:
                    raise QkvError(f"{used} is the old name of {new}; give {new} alone")
                click.echo(f"qkv: {used} is now {said}{', the first argument' if new == 'TEXT' else ''}; "
                           "the old name goes in a later release", err=True)
                kwargs[dest] = value if values is None else values[value]
            return f(*args, **kwargs)

        option = click.option(old, hidden, default=None, hidden=True, is_flag=flag or None)
        return option(command)

    return decorate


def patching_metric(model, token: str | None, other: str | None):
    """The metric `qkv patch` and `qkv atp` compare runs by, from --token/--other: a decoder's (token, other), the
    logit difference at the last position (both required); an encoder's analysis.patch.EMBEDDING, the cosine of
    sentence embeddings (neither allowed: a masked-LM head's logits are at a mask, not the end). Checked here, so
    bad input fails before any output directory is touched."""
    from ..analysis.patch import EMBEDDING, metric_of

    if model.weights.W_vocab is None or not getattr(model.config, "causal", True):
        if token is not None or other is not None:
            raise QkvError(f"{model.name} is an encoder: its patching metric is the cosine similarity of sentence "
                           "embeddings, so --token/--other (the last position's logits) do not apply; drop them")
        metric = EMBEDDING
    elif token is None or other is None:
        raise QkvError(f"{model.name} is a decoder: give --token and --other, TEXT's and CORRUPTED's next tokens "
                       "(e.g. --token ' Mary' --other ' John')")
    else:
        metric = (token, other)
    metric_of(model, metric)
    return metric
