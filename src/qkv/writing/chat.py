"""Chat: a conversation through the model's own chat template, then writing until the turn ends.

    [{"role": "user", "content": "What is the capital of France?"}]
      ─chat template (tokenizer.py: Jinja, sandboxed)─▶ "<|im_start|>user\\nWhat is …<|im_end|>\\n<|im_start|>assistant\\n"
      ─tokenizer─▶ prompt ids (n,)
      ─decode (generate.py: prefill, then one token at a time from the KV cache)─▶ the reply
                                                                 … until the end-of-turn token

The end of a turn is the tokenizer's eos_token (SmolLM2: <|im_end|>) or the model's EOS.
Sampling is greedy by default (temperature 0): the same question gets the same answer.
The model comes in as an argument: this module never imports qkv.models.model (which imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ..runtime.errors import QkvError
from ..inputs.chat_template import TEMPLATE_CHARS
from ..inputs.tokenizer import check_messages
from .generate import TextStream, check_can_generate
from .sampling import Sampling

if TYPE_CHECKING:
    from .handles import Writer

MAX_NEW_TOKENS = 256
TEMPERATURE = 0.0


def check_can_chat(model: Writer) -> None:
    """Chat needs a decoder whose checkpoint ships a chat template."""
    if getattr(model.config, "encoder_decoder", False):
        raise QkvError(f"{model.name} is an encoder–decoder (a translator): it cannot chat; translate with "
                       f"`qkv translate --model {model.name} TEXT`, or chat with a chat model, e.g. --model smollm2")
    if not model.config.causal or model.weights.W_vocab is None:
        raise QkvError(f"{model.name} is an encoder ({model.config.family}): it cannot write a reply; "
                       "chat with a chat model, e.g. --model smollm2")
    if model.tokenizer is None or model.tokenizer.chat_template is None:
        raise QkvError(f"{model.name} has no chat template (no chat_template in its tokenizer_config.json), so "
                       "it was not trained to chat; use a chat model, e.g. --model smollm2, or continue plain "
                       "text with `qkv generate`")


def as_messages(messages_or_text, system: str | None = None) -> list[dict[str, str]]:
    """A text is one user turn; `system`, if given, goes first."""
    if isinstance(messages_or_text, str):
        if not messages_or_text.strip():
            raise QkvError("the message is empty; ask something")
        messages = [{"role": "user", "content": messages_or_text}]
    else:
        messages = list(messages_or_text) if isinstance(messages_or_text, (list, tuple)) else messages_or_text
    if system is not None:
        if not isinstance(system, str):
            raise QkvError(f"system must be a string, got {type(system).__name__}")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict) \
                and messages[0].get("role") == "system":
            raise QkvError("the messages already begin with a system message; give the system message once")
        messages = [{"role": "system", "content": system}] + messages
    return messages


def check_fits(model: Writer, messages) -> list[dict[str, str]]:
    """The checked messages, or one error when they cannot fit the model's context, said in tokens
    ("the user message has 166,667 tokens, more than SmolLM2's context of 8,192") before the chat template
    renders them: a long message is the user's to shorten, not a template's fault (its render is bounded at
    TEMPLATE_CHARS characters, inputs.tokenizer)."""
    messages = check_messages(messages)
    limit, total = model.config.max_positions, 0
    roles = [m["role"] for m in messages]
    for i, m in enumerate(messages):
        which = ("the message" if len(messages) == 1 else f"the {m['role']} message" if roles.count(m["role"]) == 1
                 else f"message {i} ({m['role']})")
        text = m["content"][:TEMPLATE_CHARS]                     # past it only its characters are counted
        n = len(model.tokenizer.encode(text, add_special_tokens=False)[0])
        if len(m["content"]) > TEMPLATE_CHARS:
            size = f"{which} has {len(m['content']):,} characters"
            raise QkvError(f"{size} (its first {TEMPLATE_CHARS:,} alone are {n:,} tokens), more than {model.name}'s "
                           f"context of {limit:,}; shorten it" if n > limit else
                           f"{size}, more than the {TEMPLATE_CHARS:,} a chat prompt may hold; shorten it")
        if n > limit:
            raise QkvError(f"{which} has {n:,} tokens, more than {model.name}'s context of {limit:,}; shorten it")
        total += n
    if total > limit:
        raise QkvError(f"the messages have {total:,} tokens together, more than {model.name}'s context of "
                       f"{limit:,}; shorten or drop some")
    return messages


def end_of_turn(model: Writer) -> list[int]:
    """The token ids that end a reply: the tokenizer's eos_token (the chat template's end of a
    turn); the model's own EOS stops generation as well (generate.stop_ids)."""
    eos = model.tokenizer.eos_token_id
    return [] if eos is None else [eos]


def chat_sampling(sampling: Sampling | None = None, **settings) -> Sampling:
    """`sampling` with settings changed by name; by default greedy (temperature TEMPERATURE)."""
    return Sampling.of(sampling or Sampling(temperature=TEMPERATURE), **settings)


def chat_stream(model: Writer, messages_or_text, max_new_tokens: int = MAX_NEW_TOKENS,
                sampling: Sampling | None = None, *, system: str | None = None, use_cache: bool = True,
                record: bool = False, **settings) -> TextStream:
    """The reply as a TextStream: iterate it for text pieces; then `prompt_ids` (the rendered
    conversation) and `new_ids` (the reply, without the end-of-turn token) hold the tokens.

    sampling (or its fields by name: temperature, top_k, top_p, seed): greedy by default.
    record: keep what the passes compute, for a quick `trace()` (TextStream)."""
    check_can_chat(model)
    sampling = chat_sampling(sampling, **settings)
    messages = check_fits(model, as_messages(messages_or_text, system))
    ids = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return TextStream(model, ids, max_new_tokens, sampling, stop=end_of_turn(model), use_cache=use_cache,
                      record=record)


def chat(model: Writer, messages_or_text, max_new_tokens: int = MAX_NEW_TOKENS, sampling: Sampling | None = None, *,
         system: str | None = None, use_cache: bool = True, **settings) -> str:
    """The model's reply to a message (a text is one user turn) or a conversation, as text."""
    return "".join(chat_stream(model, messages_or_text, max_new_tokens, sampling, system=system,
                               use_cache=use_cache, **settings))


class Conversation:
    """The turns so far, for a chat that goes on: `reply(text)` streams the answer to the user's
    next turn; both join the conversation (the part written so far, if the reply is stopped).

    When the conversation and max_new_tokens no longer fit the model's context, the oldest
    turns (a user message and its reply) are dropped, the system message kept; `dropped`
    counts them. record: each reply keeps what its passes compute, for a quick `last.trace()`.
    """

    def __init__(self, model: Writer, system: str | None = None, max_new_tokens: int = MAX_NEW_TOKENS,
                 sampling: Sampling | None = None, *, use_cache: bool = True, record: bool = False, **settings):
        check_can_chat(model)
        self.model, self.system, self.max_new_tokens = model, system, max_new_tokens
        self.sampling, self.use_cache, self.record = chat_sampling(sampling, **settings), use_cache, record
        self.messages = as_messages([], system)
        self.dropped = 0
        self.last: TextStream | None = None      # the latest reply's stream (its prompt_ids, new_ids)

    def reset(self) -> None:
        """Forget every turn (the system message stays)."""
        self.messages = as_messages([], self.system)
        self.last = None

    def reply(self, text: str) -> Iterator[str]:
        """The reply's pieces (a generator) to `text` as the user's next turn. Both turns join
        the conversation when the generator ends, even stopped early, if the reply said anything.

        Raises QkvError now, before any piece, if the message cannot be answered."""
        messages, dropped = self._fitted(check_fits(self.model, as_messages(text)))
        stream = chat_stream(self.model, messages, self.max_new_tokens, self.sampling, use_cache=self.use_cache,
                             record=self.record)
        self.dropped, self.last = self.dropped + dropped, stream
        return self._pieces(messages, stream)

    def _pieces(self, messages: list[dict[str, str]], stream: TextStream) -> Iterator[str]:
        try:
            yield from stream
        finally:                                   # also when stopped (Ctrl-C, or the caller closes it)
            said = self.model.tokenizer.decode(stream.new_ids, skip_special_tokens=True).rstrip("\ufffd")
            if said:
                self.messages = messages + [{"role": "assistant", "content": said}]

    def _fitted(self, new: list[dict[str, str]]) -> tuple[list[dict[str, str]], int]:
        """The conversation with the new turn, the oldest turns dropped until it fits the context."""
        messages = self.messages + new
        first = 1 if self.system is not None else 0
        dropped = 0
        while True:
            ids = self.model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            if len(ids) + self.max_new_tokens <= self.model.config.max_positions or len(messages) - first <= 1:
                check_can_generate(self.model, len(ids), self.max_new_tokens)   # the new turn alone too long
                return messages, dropped
            messages = messages[:first] + messages[first + 2:]
            dropped += 1
