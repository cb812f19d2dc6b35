"""Guarded file access: every path the tool writes (``outputs``) and every file it loads (``loads``).

One mechanism per class of input, below every other layer but ``errors``: the text, data, model, training,
export and cli layers write and load files only through this package.
"""
