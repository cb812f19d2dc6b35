"""User-facing errors: one line that names the file or config key at fault and how to fix it."""


class MLMAdaptError(Exception):
    """A problem with the user's configuration or data.

    The CLI prints the message alone (no traceback) and exits with status 2, so the message must say which
    file or config key is wrong and what to do about it.
    """
