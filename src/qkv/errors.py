"""The one error type for a user's mistakes (STYLE habit 6).

A `QkvError` names the problem and the fix in one sentence; the CLI prints it as one
line and exits with code 2. Anything else that escapes is a bug and stays a traceback.
"""


class QkvError(Exception):
    """A mistake in what the user asked for: bad model source, bad text, bad option."""
