"""Guarded file access: every path the tool writes (``outputs``, under ``locks``) and every file it loads
(``loads``); the layers above ``errors`` write and load files only through this package. ``secrets``: the
settings' values withheld from what an export publishes and what the tool prints."""
