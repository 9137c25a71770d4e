"""The one error type for a user's mistakes (STYLE habit 6).

A `QkvError` names the problem and the fix in one sentence; the CLI prints it as one
line and exits with code 2. Anything else that escapes is a bug and stays a traceback.
"""


class QkvError(Exception):
    """A mistake in what the user asked for: bad model source, bad text, bad option."""


def check_index(kind: str, index: int, count: int, owner: str) -> int:
    """A layer or head index (negative counts from the end) → 0..count-1, or a QkvError naming
    what exists, e.g. "head 12 does not exist: gpt2 has heads 0..11"."""
    if not -count <= index < count:
        raise QkvError(f"{kind} {index} does not exist: {owner} has {kind}s 0..{count - 1}")
    return index % count
