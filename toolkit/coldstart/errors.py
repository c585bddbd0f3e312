"""One exception type for every failure a user can act on.

The CLI prints ``ColdstartError`` as a single line (``error: ...``) and exits non-zero; anything
else is a bug and keeps its traceback.
"""


class ColdstartError(Exception):
    """A failure with a message that names the problem (file, tensor, version...)."""

    exit_code = 1
