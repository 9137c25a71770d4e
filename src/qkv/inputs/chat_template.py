"""A checkpoint's chat template, rendered in Jinja's immutable sandbox with transformers' settings and helpers
(`apply_chat_template`), bounded in time and size: the template is code from a file, so untrusted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import threading
import re
from datetime import datetime


from ..runtime.errors import QkvError


# A chat template is code from a checkpoint: its render is bounded in time and size, not only in what it may touch.
TEMPLATE_SECONDS = 2.0          # a real template renders a conversation in milliseconds
TEMPLATE_CHARS = 1_000_000      # what a render may write (and any string or list it builds): ~250k tokens
POWER_DIGITS = 4096             # x ** y only while the result stays this small (a big power is one C call)
WIDE_FORMAT = re.compile(r"%[-#0 +]*[0-9]{7}|\.[0-9]{7}")   # a %-format width or precision of millions


class TemplateTooBig(Exception):
    """A render that built or wrote more than TEMPLATE_CHARS."""


class TemplateTimeout(BaseException):
    """Raised inside a render that ran past TEMPLATE_SECONDS (BaseException: the template's own code cannot
    catch it, nor can Jinja's `except Exception`)."""


class _Deadline:
    """Interrupts the calling thread with TemplateTimeout after SECONDS, at its next Python instruction
    (CPython's PyThreadState_SetAsyncExc; a template's loops are Python code). Used as a context manager;
    an interruption that has not landed by the time the block ends is withdrawn."""

    def __init__(self, seconds: float):
        self.seconds, self.thread = seconds, threading.get_ident()
        self.lock, self.active, self.sent = threading.Lock(), False, False
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        import ctypes

        with self.lock:
            if self.active:
                self.sent = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread), ctypes.py_object(TemplateTimeout))

    def __enter__(self) -> "_Deadline":
        self.active = True
        self.timer.start()
        return self

    def __exit__(self, kind, value, tb) -> bool:
        import ctypes

        with self.lock:
            self.active = False
            if self.sent and kind is not TemplateTimeout:      # sent but not raised yet: withdraw it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread), None)
        self.timer.cancel()
        return False


def _sized(x) -> int | None:
    return len(x) if isinstance(x, (str, list, tuple)) else None


_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def rust_panics_hidden():
    """While inside, file descriptor 2 goes to a temporary file; on leaving, what was written there returns to
    stderr except a Rust panic's report (`thread '…' panicked at …`, its message, its notes and backtrace),
    which the caller turns into one line. Serialised by a lock: other threads' writes wait or pass through."""
    import tempfile

    with _STDERR_LOCK:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                text = sink.read().decode("utf-8", "replace")
                if "panicked at" in text:                           # the report runs to the end
                    text = text[:text.find("thread '")] if "thread '" in text else ""
                if text:
                    sys.stderr.write(text)


def _environment():
    """Jinja as transformers sets it up for chat templates: the immutable sandbox, blocks that
    leave no stray newlines, {% break %}/{% continue %}, and its helpers; with * + ** % and ~ bounded
    (`'x' * 10**8`, a string doubled in a loop, `10 ** 10**8`, `'%0999999999d' % 1` would each be one
    long C call, beyond the deadline's reach)."""
    import jinja2
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame):             # a ~ b ~ c: joined by Sandbox.bounded_join
            self.write("environment.bounded_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "+", "**", "%"])
        code_generator_class = Generator

        @staticmethod
        def bounded_join(parts) -> str:
            parts = [str(p) for p in parts]
            if sum(map(len, parts)) > TEMPLATE_CHARS:
                raise TemplateTooBig
            return "".join(parts)

        def call_binop(self, context, operator, left, right):
            a, b = _sized(left), _sized(right)
            if operator == "*" and (a is not None or b is not None):
                times = right if a is not None else left
                if isinstance(times, int) and (a if a is not None else b) * max(0, times) > TEMPLATE_CHARS:
                    raise TemplateTooBig
            elif operator == "+" and a is not None and b is not None and a + b > TEMPLATE_CHARS:
                raise TemplateTooBig
            elif operator == "%" and isinstance(left, str) and WIDE_FORMAT.search(left):
                raise TemplateTooBig                   # a width or precision of millions
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                    and right * math.log10(abs(left)) > POWER_DIGITS:
                raise TemplateTooBig
            return super().call_binop(context, operator, left, right)

    class Undefined(jinja2.Undefined):
        """An undefined name is empty and false, as usual; but what the sandbox refused
        (`''.__class__`) fails as soon as it is used at all, where Jinja would print ''."""

        def _refused(self) -> bool:
            return self._undefined_exception is jinja2.exceptions.SecurityError

        def __str__(self):
            return self._fail_with_undefined_error() if self._refused() else super().__str__()

        def __bool__(self):
            return self._fail_with_undefined_error() if self._refused() else super().__bool__()

        def __iter__(self):
            return self._fail_with_undefined_error() if self._refused() else super().__iter__()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, undefined=Undefined, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson                      # Jinja's own escapes HTML characters
    center, fmt = env.filters["center"], env.filters["format"]       # one C call each: bounded before it

    def bounded_center(value, width=80):
        if isinstance(width, int) and width > TEMPLATE_CHARS:
            raise TemplateTooBig
        return center(value, width)

    def bounded_format(value, *args, **kwargs):
        if isinstance(value, str) and WIDE_FORMAT.search(value):
            raise TemplateTooBig
        return fmt(value, *args, **kwargs)

    indent = env.filters["indent"]

    def bounded_indent(value, width=4, *args, **kwargs):
        lines = str(value).count("\n") + 1
        if (len(width) if isinstance(width, str) else width if isinstance(width, int) else 0) * lines > TEMPLATE_CHARS:
            raise TemplateTooBig
        return indent(value, width, *args, **kwargs)

    env.filters.update(center=bounded_center, format=bounded_format, indent=bounded_indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The compiled template (a conversation renders the same one every turn)."""
    return _environment().from_string(template)


def one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def render_chat_template(template: str, messages: list[dict[str, str]], add_generation_prompt: bool,
                         special_tokens: dict[str, str]) -> str:
    """The template's text for these messages. Its mistakes (bad syntax, a refusal through
    raise_exception, an unsafe attribute) are one QkvError, never a traceback or an escape."""
    import jinja2

    try:
        compiled = _compiled(template)
    except jinja2.TemplateSyntaxError as e:
        raise QkvError(f"the chat template is not valid Jinja (line {e.lineno}: {one_line(e)}); "
                       "fix chat_template in tokenizer_config.json") from None
    too_big = QkvError(f"the chat template wrote or built more than {TEMPLATE_CHARS:,} characters; "
                       "use a trusted chat template")
    try:
        parts, size = [], 0
        with _Deadline(TEMPLATE_SECONDS):
            for part in compiled.generate(messages=messages, add_generation_prompt=bool(add_generation_prompt),
                                          tools=None, documents=None, **special_tokens):
                size += len(part)
                if size > TEMPLATE_CHARS:
                    raise too_big
                parts.append(part)
        return "".join(parts)
    except TemplateTimeout:
        raise QkvError(f"the chat template ran for more than {TEMPLATE_SECONDS:g} s (a loop without end?); "
                       "use a trusted chat template") from None
    except (TemplateTooBig, MemoryError):
        raise too_big from None
    except QkvError:
        raise
    except jinja2.exceptions.SecurityError as e:
        raise QkvError(f"the chat template tried something unsafe and was stopped ({one_line(e)}); "
                       "use a trusted chat template") from None
    except jinja2.TemplateError as e:
        if not isinstance(e, jinja2.UndefinedError):      # the template's raise_exception(...)
            raise QkvError(f"the chat template refused these messages: {one_line(e)}") from None
        raise QkvError(f"the chat template failed ({one_line(e)}); fix chat_template in tokenizer_config.json") \
            from None
    except Exception as e:                              # the template's own bug, e.g. 'a' + 1
        raise QkvError(f"the chat template failed ({type(e).__name__}: {one_line(e)}); "
                       "fix chat_template in tokenizer_config.json") from None
