"""Logging for heed's commands: one format, and control characters escaped.

A log line may quote what a client sent (a path, a cancel reason). Without escaping, a
request for ``/x%0AERROR heed: forged`` writes a second, forged line, and an ESC byte can
drive the reader's terminal. :class:`EscapingFormatter` writes every control character of
a record's message (and of its arguments) as an escape (``\\x1b``, ``\\r``, ``\\t``),
except a newline, which stays a newline followed by an indent: a multi-line message (a
traceback a library logs as text) stays readable, and no line it adds can start where a
record starts, so none can pass for one.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Final, TextIO

__all__ = ["EscapingFormatter", "configure_logging", "escape_control"]

FORMAT: Final = "%(levelname)s %(name)s: %(message)s"
CONTINUATION: Final = "\n    "
"""What a newline in a message becomes: a new line that cannot pass for a record's start."""
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\n":
        return CONTINUATION
    return {"\r": "\\r", "\t": "\\t"}.get(char) or f"\\x{ord(char):02x}"


def escape_control(text: str) -> str:
    """*text* with every control character (C0, DEL, C1, line separators) escaped, and
    each newline followed by an indent (module docstring)."""
    return _CONTROL.sub(_escaped, text)


class EscapingFormatter(logging.Formatter):
    """A formatter whose message part cannot hold a control character (module docstring)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_control(record.message)
        return super().formatMessage(record)


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Send every logger's records (uvicorn's included) to *stream* (stderr) at *level*."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(EscapingFormatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
