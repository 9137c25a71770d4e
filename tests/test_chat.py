"""Chat: the chat template renders as transformers renders it (sandboxed), SmolLM2's greedy reply equals
transformers', and `qkv chat` answers once or keeps a conversation. Fixtures: fixtures/make_chat_fixtures.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from qkv.writing.chat import Conversation, as_messages, chat_stream
from qkv.cli.app import cli
from qkv.runtime.errors import QkvError
from qkv.writing.generate import TextStream
from qkv.inputs.tokenizer import Tokenizer
from qkv.inputs.chat_template import render_chat_template
from qkv.core.trace import Trace
from conftest import FIXTURES, MODELS, run_main

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

SMOLLM2 = json.loads((FIXTURES / "chat" / "smollm2.json").read_text())
HF_DIRECTORY = json.loads((FIXTURES / "chat" / "hf_directory.json").read_text())
FRANCE = "What is the capital of France?"
PARIS = "The capital of France is Paris."
USER = [{"role": "user", "content": FRANCE}]


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


def hf_directory(tmp_path, config: dict | str | None, jinja: str | None = None):
    """A checkpoint-like directory: the gpt2 fixture's tokenizer.json and this tokenizer_config.json."""
    shutil.copy(MODELS / "gpt2" / "tokenizer.json", tmp_path / "tokenizer.json")
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "tokenizer_config.json").write_text(text)
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return tmp_path


def one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message, message
    return message


# ── the template: equal to transformers ──────────────────────────────────────────

@pytest.mark.parametrize("case", SMOLLM2["templates"], ids=lambda c: f"{len(c['messages'])}msg-"
                         f"{'gen' if c['add_generation_prompt'] else 'nogen'}")
def test_smollm2_template_equals_transformers(smollm2, case):
    tok = smollm2.tokenizer
    agp = case["add_generation_prompt"]
    assert tok.apply_chat_template(case["messages"], add_generation_prompt=agp, tokenize=False) == case["text"]
    assert tok.apply_chat_template(case["messages"], add_generation_prompt=agp) == case["ids"]
    if not agp:                                       # transformers' default: no generation prompt
        assert tok.apply_chat_template(case["messages"]) == case["ids"]


def test_smollm2_reads_its_template_and_tokens_from_the_gguf(smollm2):
    tok = smollm2.tokenizer
    assert "<|im_start|>" in tok.chat_template
    assert tok.special_tokens["eos_token"] == SMOLLM2["eos_token"] and tok.eos_token_id == 2
    text = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    assert text.endswith(f"<|im_start|>user\n{FRANCE}<|im_end|>\n<|im_start|>assistant\n")   # the default system
    assert text.startswith("<|im_start|>system\n")                                           # message comes first


@pytest.mark.parametrize("i", range(len(HF_DIRECTORY["cases"])))
def test_hf_directory_template_equals_transformers(tmp_path, i):
    """List-of-named-templates, {"content": ...} tokens, tojson, {% break %}, raise_exception."""
    case = HF_DIRECTORY["cases"][i]
    tok = Tokenizer.from_directory(hf_directory(tmp_path, case["tokenizer_config"]))
    agp = case["add_generation_prompt"]
    if "error" in case:
        with pytest.raises(QkvError) as e:
            tok.apply_chat_template(case["messages"], add_generation_prompt=agp)
        assert one_line(e) == f"the chat template refused these messages: {case['error']}"
        return
    assert tok.apply_chat_template(case["messages"], add_generation_prompt=agp, tokenize=False) == case["text"]
    assert tok.apply_chat_template(case["messages"], add_generation_prompt=agp) == case["ids"]


def test_chat_template_jinja_file_wins_over_the_config(tmp_path):
    tok = Tokenizer.from_directory(hf_directory(tmp_path, {"chat_template": "config"}, jinja="file {{ eos_token }}"))
    assert tok.apply_chat_template(USER, tokenize=False) == "file "
    assert Tokenizer.from_directory(hf_directory(tmp_path / "..", None)).chat_template is None


# ── bad input: one line ──────────────────────────────────────────────────────────

@pytest.mark.parametrize("config, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a JSON object"),
    ('{"chat_template": ' + "[" * 10000 + "]" * 10000 + "}", "is nested too deeply"),   # past Python's parser
    ('{"eos_token": ' + "[" * 100 + "]" * 100 + "}", "is nested too deeply"),            # past qkv's bound
    ({"chat_template": 3}, "chat_template must be a string or a list"),
    ({"chat_template": [{"name": "tool_use", "template": "x"}]}, "no 'default'"),
    ({"chat_template": [{"name": "default"}]}, "chat_template must be a string or a list"),
    ({"eos_token": 2}, "eos_token must be a string"),
    ({"bos_token": {"text": "<s>"}}, "bos_token must be a string"),
])
def test_a_bad_tokenizer_config_is_one_line(tmp_path, config, message):
    with pytest.raises(QkvError) as e:
        Tokenizer.from_directory(hf_directory(tmp_path, config))
    assert message in one_line(e) and "tokenizer_config.json" in str(e.value)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__ }}",                                     # printing what the sandbox refused
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% if messages.__class__ %}yes{% endif %}",
    "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",      # the messages are immutable
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['os'] }}",
])
def test_the_sandbox_stops_a_template_touching_python_internals(template):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(QkvError) as e:
        render_chat_template(template, messages, True, {})
    assert "unsafe" in one_line(e)
    assert messages == [{"role": "user", "content": "hi"}]


def test_undefined_names_render_empty_as_in_transformers():
    assert render_chat_template("{{ nothing }}{% if tools %}x{% endif %}{{ eos_token }}.", USER, True, {}) == "."


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}", "not valid Jinja"),
    ("{{ raise_exception('Only user turns, please') }}", "refused these messages: Only user turns, please"),
    ("{{ 1 + 'a' }}", "failed (TypeError"),
    ("{{ nothing.at_all }}", "failed"),
])
def test_a_broken_template_is_one_line(template, message):
    with pytest.raises(QkvError) as e:
        render_chat_template(template, USER, True, {})
    assert message in one_line(e)


@pytest.mark.parametrize("template, message", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran for more than 2 s"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% if i %}{% endif %}{% endfor %}{% endfor %}",
     "ran for more than"),
    ("{{ 'x' * 100000000 }}", "more than 1,000,000 characters"),
    ("{{ 100000000 * ['x'] }}", "more than 1,000,000 characters"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
     "more than 1,000,000"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     "more than 1,000,000"),
    ("{{ 10 ** 100000000 }}", "more than 1,000,000"),
    ("{{ '%0999999999d' % 1 }}", "more than 1,000,000"),
    ("{{ '%0999999999d'|format(1) }}", "more than 1,000,000"),              # the same through a filter
    ("{{ 'x'|center(100000000) }}", "more than 1,000,000"),
    ("{{ 'a\\nb'|indent(100000000, true) }}", "more than 1,000,000"),
    ("{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}", "more than 1,000,000"),
])
def test_a_template_that_runs_or_grows_without_end_is_stopped_in_one_line(template, message):
    with pytest.raises(QkvError) as e:
        render_chat_template(template, USER, True, {})
    assert message in one_line(e) and "trusted chat template" in str(e.value)


def test_bounded_operators_still_compute_what_jinja_computes():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ("{{ 2 ** 10 }} {{ [1, 2] * 2 }} {{ 3 * 'ab' }} {{ 'a' + 'b' }} {{ 1 + 2 }} {{ 'a' ~ 1 ~ x }} "
                "{{ '%3d|%s' % (7, 'y') }} {{ 7 % 3 }} {{ 2.5 * 2 }} {{ 'ab'|center(6) }}|{{ '%2d'|format(5) }}|"
                "{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent('> ', true) }}")
    plain = ImmutableSandboxedEnvironment().from_string(template).render(messages=USER)
    assert render_chat_template(template, USER, True, {}) == plain == \
        "1024 [1, 2, 1, 2] ababab ab 3 a1   7|y 1 5.0   ab  | 5|a\n  b|> a\n> b"


def test_a_deadline_that_fires_as_the_render_ends_never_lands_later(monkeypatch):
    """The interruption is withdrawn when it has not landed by the render's end: no TemplateTimeout escapes
    into the code after it, however the timer and the render race."""
    import time

    import qkv.inputs.chat_template as chat_template

    monkeypatch.setattr(chat_template, "TEMPLATE_SECONDS", 0.002)
    template = "{% for i in range(3000) %}{% endfor %}{{ messages[0].content }}"
    outcomes = set()
    for _ in range(200):
        try:
            outcomes.add(render_chat_template(template, USER, True, {}))
        except QkvError as e:
            outcomes.add("stopped" if "ran for more than" in str(e) else str(e))
        deadline = time.perf_counter() + 0.004                  # Python code after the render, past the timer
        while time.perf_counter() < deadline:
            pass
    assert outcomes <= {FRANCE, "stopped"}


def test_an_empty_render_says_so(tmp_path):
    tok = Tokenizer.from_directory(hf_directory(tmp_path, {"chat_template": "{% if false %}x{% endif %}"}))
    with pytest.raises(QkvError) as e:
        tok.apply_chat_template(USER)
    assert "wrote nothing for these messages" in one_line(e)


def test_a_tokenizer_whose_regex_backtracks_without_end_is_one_line(tmp_path, capfd):
    spec = json.loads((MODELS / "gpt2" / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tok = Tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(QkvError) as e:
        tok.encode("a" * 40 + "!")
    assert "the tokenizer failed on this text" in one_line(e) and "replace it" in str(e.value)
    assert "panicked" not in capfd.readouterr().err                   # Rust's report is not printed
    assert tok.encode("hello")[1]                                       # and the tokenizer still works


def test_cli_chat_with_a_template_that_never_ends_is_one_line(monkeypatch, capsys, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(MODELS / "gpt2", model)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": loops, "eos_token": "<|endoftext|>"}))
    code, out, err = run_main(monkeypatch, capsys, "chat", "hi", "--model", str(model))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "ran for more than 2 s" in err, err


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "user"}], "message 0"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 3}], "message 1"),
    ([{"role": "user", "content": "a", "name": "x"}], "nothing else"),
    (["hello"], "message 0"),
])
def test_bad_messages_are_one_line(smollm2, messages, message):
    with pytest.raises(QkvError) as e:
        smollm2.tokenizer.apply_chat_template(messages)
    assert message in one_line(e)


def test_no_template_says_so(tmp_path):
    with pytest.raises(QkvError) as e:
        Tokenizer.from_directory(hf_directory(tmp_path, {"eos_token": "</s>"})).apply_chat_template(USER)
    assert "no chat template" in one_line(e)


def test_as_messages():
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]
    assert as_messages("hi", system="be kind") == [{"role": "system", "content": "be kind"},
                                                   {"role": "user", "content": "hi"}]
    with pytest.raises(QkvError, match="once"):
        as_messages([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}], system="c")
    with pytest.raises(QkvError, match="empty"):
        as_messages("  ")


# ── the reply: equal to transformers' greedy generate ────────────────────────────

@pytest.mark.parametrize("case", SMOLLM2["replies"], ids=lambda c: c["text"][:20])
def test_greedy_reply_equals_transformers(smollm2, case):
    """Token for token (the reply up to <|im_end|>, or max_new_tokens), and the same text."""
    stream = chat_stream(smollm2, case["messages"], case["max_new_tokens"])
    assert "".join(stream) == case["text"]
    assert stream.new_ids == case["ids"]


def test_model_chat_text_stream_and_system(smollm2):
    assert smollm2.chat(FRANCE, max_new_tokens=32) == PARIS                   # ended by <|im_end|>, not the limit
    pieces = list(smollm2.chat(USER, max_new_tokens=32, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == PARIS
    system = "You are a concise assistant. Answer in one sentence."
    case = SMOLLM2["replies"][1]
    assert smollm2.chat("Why is the sky blue?", max_new_tokens=case["max_new_tokens"], system=system) == case["text"]


def test_text_stream_from_ids_equals_from_text():
    model = qkv.load(MODELS / "gpt2")
    ids, _ = model.encode("the cat sat")
    a = TextStream(model, "the cat sat", 6, temperature=0, stop_at_eos=False)
    b = TextStream(model, ids, 6, temperature=0, stop_at_eos=False)
    assert "".join(a) == "".join(b) and a.new_ids == b.new_ids and len(a.new_ids) == 6
    with pytest.raises(QkvError, match="one sequence"):
        TextStream(model, np.stack([ids, ids]), 6)


def test_chat_refuses_encoders_and_models_without_a_template(minilm):
    with pytest.raises(QkvError, match="is an encoder"):
        minilm.chat("hi")
    with pytest.raises(QkvError, match="no chat template"):
        qkv.load(MODELS / "gpt2").chat("hi")


# ── a conversation ───────────────────────────────────────────────────────────────

PAST = [{"role": "user", "content": "Hi! My name is Ana."},
        {"role": "assistant", "content": "Nice to meet you, Ana! How can I help you today?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road? To get to the other side."}]


def test_a_conversation_keeps_the_turns(smollm2):
    chat = Conversation(smollm2, system="Be brief.", max_new_tokens=32)
    assert "".join(chat.reply(FRANCE)) == smollm2.chat(FRANCE, max_new_tokens=32, system="Be brief.")
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant"]
    "".join(chat.reply("And of Italy?"))
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert chat.last.prompt_ids.tolist() == smollm2.tokenizer.apply_chat_template(chat.messages[:4], add_generation_prompt=True)
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "Be brief."}] and chat.last is None


def test_a_long_conversation_drops_its_oldest_turns(smollm2):
    """The whole conversation is 84 tokens, without its first exchange 51: with a context of 60 and 4 new
    tokens, the first exchange goes (the system message stays)."""
    small = smollm2.with_config(max_positions=60)
    chat = Conversation(small, system="Be brief.", max_new_tokens=4)
    chat.messages = chat.messages + PAST
    "".join(chat.reply("Another one?"))
    assert chat.dropped == 1
    assert chat.messages[:4] == [{"role": "system", "content": "Be brief."}] + PAST[2:] + [
        {"role": "user", "content": "Another one?"}]
    assert len(chat.last.prompt_ids) == 51
    kept = list(chat.messages)
    with pytest.raises(QkvError) as e:                        # the question alone is too long: nothing changes
        chat.reply("word " * 100)
    assert "context of 60" in one_line(e) and chat.messages == kept


def test_a_stopped_reply_keeps_what_was_said(smollm2):
    chat = Conversation(smollm2, max_new_tokens=32)
    pieces = chat.reply(FRANCE)
    first = next(pieces)
    pieces.close()                                            # as Ctrl-C does
    assert chat.messages[-1] == {"role": "assistant", "content": first} and PARIS.startswith(first)
    kept = list(chat.messages)
    pieces = chat.reply("And of Italy?")
    pieces.close()                                            # stopped before a word: the question goes too
    assert chat.messages == kept


# ── qkv chat ─────────────────────────────────────────────────────────────────────

def test_cli_answers_once_streaming_and_saves_the_trace(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "chat", FRANCE, "--trace", str(tmp_path / "t"))
    assert code == 0 and out == PARIS + "\n", err
    trace = Trace.load(tmp_path / "t")
    prompt = qkv.load("smollm2").tokenizer.apply_chat_template(USER, add_generation_prompt=True)
    assert trace.ids[:len(prompt)].tolist() == prompt and trace.prompt_length == len(prompt)
    assert len(trace.ids) == len(prompt) + 7                  # "The capital of France is Paris." = 7 tokens
    assert trace.attentions.shape == (30, 9, len(trace.ids), len(trace.ids))


def test_cli_system_and_sampling_options(monkeypatch, capsys):
    case = SMOLLM2["replies"][1]
    code, out, _ = run_main(monkeypatch, capsys, "chat", "Why is the sky blue?", "--system",
                            case["messages"][0]["content"], "-n", str(case["max_new_tokens"]))
    assert code == 0 and out == case["text"] + "\n"
    runs = [run_main(monkeypatch, capsys, "chat", "Name a colour.", "-t", "1", "--top-k", "40", "--seed", "7",
                     "-n", "8")[1] for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].strip()             # sampled, repeatable with a seed


def test_cli_interactive_loop_keeps_resets_and_ends_at_eof():
    lines = [FRANCE, "And of Italy?", "/reset", "/help", "/nonsense", "", FRANCE]
    r = CliRunner().invoke(cli, ["chat", "-n", "24"], input="\n".join(lines) + "\n")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("chatting with SmolLM2-135M-Instruct: /reset clears the conversation")
    assert r.output.count(f"> {PARIS}\n") == 2                # after /reset, the same first answer again
    assert "(the conversation is cleared)" in r.output
    assert "unknown command /nonsense" in r.output and r.output.count("/quit or Ctrl-D quits") == 3
    assert r.output.endswith("> \n")                          # EOF: a clean end


def test_cli_interactive_a_failed_turn_does_not_end_the_chat():
    r = CliRunner().invoke(cli, ["chat", "-n", "16"], input="word " * 9000 + f"\n{FRANCE}\n/quit\n")
    assert r.exit_code == 0
    assert "qkv: error: the message has 9,000 tokens, more than" in r.output and f"> {PARIS}\n" in r.output


def test_cli_interactive_ctrl_c_stops_only_the_reply(monkeypatch):
    """Ctrl-C after the first piece of a reply: the reply stops, the chat goes on."""
    real = TextStream.__iter__
    calls = []

    def interrupted(self):
        calls.append(1)
        for i, piece in enumerate(real(self)):
            if i == 1 and len(calls) == 1:
                raise KeyboardInterrupt
            yield piece

    monkeypatch.setattr(TextStream, "__iter__", interrupted)
    r = CliRunner().invoke(cli, ["chat", "-n", "24"], input=f"{FRANCE}\n{FRANCE}\n")
    assert r.exit_code == 0, r.output
    assert "> The [stopped]\n" in r.output and f"> {PARIS}\n" in r.output


# The child of the terminal test: `qkv chat` whose reply, after its first piece, says so (MARKER) and waits for a
# line typed on the terminal (the user typing while it streams), then goes on.
TYPING_CHILD = """
import select, sys
from qkv.writing.generate import TextStream
real = TextStream.__iter__
def waiting(self):
    for i, piece in enumerate(real(self)):
        yield piece
        if i == 0:
            print("{marker}", end="", flush=True)
            select.select([sys.stdin], [], [], {patience})
TextStream.__iter__ = waiting
sys.argv = ["qkv", "--quiet", "chat", "--model", {model!r}, "-n", "6"]
from qkv.cli.app import main
main()
"""
MARKER = "<<reply-streaming>>"


def test_cli_interactive_text_typed_during_a_reply_is_not_echoed_and_is_discarded(tmp_path):
    """On a terminal (a pty), keys typed while a reply streams do not land inside the reply (echo off), and the
    line typed then is discarded (tcflush) rather than sent as the next question: one reply, then the prompt."""
    import os
    import select
    import subprocess
    import sys

    from conftest import PATIENCE

    model = hf_directory(tmp_path, {"chat_template": CHATML, "eos_token": "</s>"})
    for name in ("config.json", "model.safetensors"):
        shutil.copy(MODELS / "gpt2" / name, model / name)
    master, slave = os.openpty()
    child = subprocess.Popen([sys.executable, "-c", TYPING_CHILD.format(marker=MARKER, patience=PATIENCE,
                                                                          model=str(model))],
                             stdin=slave, stdout=slave, stderr=slave, env={**os.environ, "TERM": "dumb"})
    os.close(slave)
    seen = b""

    def read_until(text: str, start: int = 0) -> None:
        nonlocal seen
        while text.encode() not in seen[start:]:
            ready, _, _ = select.select([master], [], [], PATIENCE)              # a hang guard, not a speed limit
            assert ready, seen
            try:
                seen += os.read(master, 4096)
            except OSError:                                                   # the child ended: the pty closed
                raise AssertionError(seen) from None

    try:
        read_until("> ")
        os.write(master, b"hello there\n")
        read_until(MARKER)
        os.write(master, b"typed while busy\n")                                # the user types during the reply
        read_until("\n> ", seen.index(MARKER.encode()))
        os.write(master, b"/quit\n")
        assert child.wait(PATIENCE) == 0
    finally:
        child.kill()
        child.wait()
        os.close(master)
    out = seen.decode(errors="replace")
    assert "typed while busy" not in out                                        # never echoed into the reply
    assert out.count(MARKER) == 1                                               # nor sent as the next question


@pytest.mark.parametrize("args, message", [
    (["chat", "hi", "--model", "minilm"], "is an encoder"),
    (["chat", "--model", "minilm"], "is an encoder"),                         # the loop refuses before asking
    (["chat", "hi", "--model", str(MODELS / "gpt2")], "has no chat template"),
    (["chat", "hi", "--top-p", "2"], "top_p"),
    (["chat", "hi", "-n", "0"], "max_new_tokens"),
    (["chat", "hi", "-n", "9000"], "context of 8192"),
    (["chat", " "], "the message is empty"),
])
def test_cli_mistakes_give_one_line_and_exit_2(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
