"""Parsers that misbehave, for file retain's parsing child (module-level: a child imports
them by name): one spins on the CPU, one hoards memory, one sleeps."""

from __future__ import annotations

import time

from heed.memory.files import FileLimits, UploadedFile


def spin(index: int, file: UploadedFile, limits: FileLimits) -> tuple[str, str]:
    """Burns CPU until killed."""
    n = 0
    while True:
        n += 1


def hoard(index: int, file: UploadedFile, limits: FileLimits) -> tuple[str, str]:
    """Allocates 64 MB at a time until an allocation fails."""
    kept = []
    while True:
        kept.append(bytearray(64 * 1024 * 1024))


def doze(index: int, file: UploadedFile, limits: FileLimits) -> tuple[str, str]:
    """Sleeps, using no CPU, for longer than any test waits."""
    time.sleep(600)
    return "text", "never"
