"""Module-level functions for process offload tests (they must be importable by a child)."""

from __future__ import annotations

import os
import time


def spin_forever(pid_file: str) -> None:
    """A loop that never checks a token."""
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    while True:
        sum(i * i for i in range(1000))


def square(x: int) -> int:
    return x * x


def fail(message: str) -> None:
    raise ValueError(message)


def sleep_then_return(seconds: float) -> str:
    time.sleep(seconds)
    return "done"
