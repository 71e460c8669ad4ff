"""Parsing a file: its text, in a process of its own, bounded and killed on cancel.

A parser's work does not always follow the file's size: a few kilobytes may declare a
million rows, a cell spanning fifty million columns, or twenty thousand nested blocks.
:mod:`heed.memory.files.readers` bounds what it knows of; this module bounds the rest:

- :func:`extract_text` is the blocking parse of one file (the rules of
  :mod:`heed.memory.files.rules`, a reader per format).
- :func:`parse_file` runs it in a child process (:func:`heed.runtime.run_in_process`)
  under :class:`~heed.runtime.ProcessLimits` from
  :class:`~heed.memory.files.rules.FileLimits`: CPU seconds and memory enforced by the
  kernel in the child, wall-clock time by the parent, and a lower CPU priority
  (:data:`PARSE_NICE`) than the server's. The child is terminated the moment the caller's
  token is cancelled (a client that left, a bank deleted), and :func:`parse_file` returns
  or raises only once it is gone, so a lane slot held around it bounds real CPU. A child
  past a limit is a :class:`~heed.memory.files.rules.FileTooLarge` (413) naming the file
  and the setting.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.process import BaseProcess

from heed.errors import NUL
from heed.memory.files.readers import ReadBounds, TextSink, read_html, read_office, read_pdf
from heed.memory.files.rules import (
    FileLimits,
    FileRefused,
    FileTooLarge,
    UploadedFile,
    check_size,
    check_zip,
    decode_utf8,
    detect_format,
    file_label,
)
from heed.runtime import ProcessLimits, WorkerLimitExceeded, run_in_process

__all__ = ["PARSE_NICE", "extract_text", "parse_file"]

#: How much lower a parsing child's CPU priority is than the server's: a parse competes
#: with other users' retains and recalls for the cores, and yields to them.
PARSE_NICE = 10

#: What a limit is called in messages: its setting.
_SETTINGS = {
    "cpu": ("seconds of CPU", "parse_cpu_seconds", "HEED_FILE_PARSE_CPU_SECONDS"),
    "memory": ("bytes of memory", "parse_memory_bytes", "HEED_FILE_PARSE_MEMORY_BYTES"),
    "wall": ("seconds", "parse_seconds", "HEED_FILE_PARSE_SECONDS"),
}


def extract_text(
    index: int,
    file: UploadedFile,
    limits: FileLimits,
    on_part: Callable[[int], None] | None = None,
) -> tuple[str, str]:
    """``(format, text)`` of *file*; blocking.

    Raises :class:`FileRefused` (bad, corrupt, empty, unreadable) or :class:`FileTooLarge`
    (past ``max_bytes``, ``max_unpacked_bytes``, ``max_text_chars``, ``max_tags`` or
    ``max_cells``), naming the file. *on_part* is told the number of parts read so far.
    """
    label = file_label(index, file)
    check_size(index, file, limits)
    fmt = detect_format(index, file)
    bounds = ReadBounds(limits.max_text_chars, limits.max_tags, limits.max_cells)
    sink = TextSink(label, limits.max_text_chars, on_part)
    if fmt in ("text", "markdown"):
        sink.add(decode_utf8(label, file.data))
    elif fmt == "html":
        read_html(label, file.data, bounds, sink)
    elif fmt == "pdf":
        read_pdf(label, file.data, sink)
    else:
        check_zip(label, file.data, limits)
        read_office(label, fmt, file.data, bounds, sink)
    text = sink.text().strip()
    if NUL in text:
        raise FileRefused(f"{label} holds a NUL character (U+0000), which heed does not store")
    if not text:
        hint = " (a scanned PDF? heed has no OCR)" if fmt == "pdf" else ""
        raise FileRefused(f"{label}: no text found{hint}")
    return fmt, text


async def parse_file(
    index: int,
    file: UploadedFile,
    limits: FileLimits,
    *,
    parser: Callable[[int, UploadedFile, FileLimits], tuple[str, str]] = extract_text,
    on_start: Callable[[BaseProcess], None] | None = None,
) -> tuple[str, str]:
    """``(format, text)`` of *file*, parsed by *parser* (a module-level function) in a child
    process (see the module docstring). Raises what :func:`extract_text` raises,
    :class:`FileTooLarge` past a process limit, ``OperationCancelled`` once the child is
    gone."""
    bounds = ProcessLimits(
        cpu_seconds=limits.parse_cpu_seconds,
        memory_bytes=limits.parse_memory_bytes,
        wall_seconds=limits.parse_seconds,
        nice=PARSE_NICE,
    )
    try:
        return await run_in_process(parser, index, file, limits, limits=bounds, on_start=on_start)
    except WorkerLimitExceeded as exc:
        what, field, setting = _SETTINGS[exc.limit]
        raise FileTooLarge(
            f"{file_label(index, file)} takes more than {getattr(limits, field)} {what} to "
            f"read ({setting})"
        ) from None
