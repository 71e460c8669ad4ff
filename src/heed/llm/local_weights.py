"""The packaged model's weights in the form llama.cpp evaluates fastest here: an F16 copy.

SmolLM2-135M ships as Q4_1 (92 MB). At this size, reading the weights is not what limits a
prompt's evaluation; unpacking 4-bit blocks is. On 2 cores (``benchmarks/local_model_speed.py``,
a 332-token grounded prompt), first token p50 from Q4_1 and from an F16 copy of the same
weights: 1.34 s and 0.89 s on one thread, 0.80 s and 0.56 s on two (on a slower machine of the
same kind: 2.7-3.0 s and 1.39 s, 1.65 s and 0.76 s; Q8_0 was in between). Generation stays far
above its 15 tokens/s target (about 85 tokens/s from F16 against 120 from Q4_1: one token
reads three times the bytes). The replies are those of the same model: F16 holds every Q4_1
weight exactly.

So the first load derives the F16 copy once (about a second, 260 MB) into the model cache
(``HEED_MODEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/heed/models`` or ``~/.cache/heed/models``)
and every later load reuses it. The copy's name carries the source's size and modification
time, so an upgraded package derives a new one. It is written to a temporary file and renamed
into place, so concurrent processes never read a partial copy. Where it cannot be made (no
space, a read-only cache, a llama-cpp-python without the quantize entry point), the packaged
file is used as it is and a warning says why.

Only the packaged model is converted: a ``.gguf`` path named in ``HEED_LLM_MODEL`` is used as
given (an F16 copy of a 7B model would be 14 GB).
"""

from __future__ import annotations

import ctypes
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Final

__all__ = ["default_cache_dir", "f16_copy"]

log = logging.getLogger("heed.llm")

#: llama.cpp's ``LLAMA_FTYPE_MOSTLY_F16``.
_FTYPE_F16: Final = 1


def default_cache_dir() -> Path:
    """The per-user model cache: ``$XDG_CACHE_HOME/heed/models`` or ``~/.cache/heed/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "heed" / "models"


def _copy_name(source: Path) -> str:
    stat = source.stat()
    return f"{source.stem}.{stat.st_size}-{stat.st_mtime_ns}.f16.gguf"


def f16_copy(llama_cpp: Any, source: Path, cache_dir: Path | None = None) -> Path:
    """The F16 copy of *source* in *cache_dir*, derived on first call; *source* if it cannot be.

    Blocking (call it from a worker thread); never raises for a copy that cannot be made.
    """
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    try:
        target = directory / _copy_name(source)
        if target.is_file():
            return target
        directory.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
        os.close(fd)
    except OSError as exc:
        log.warning("local model: no F16 copy in %s (%s); using %s", directory, exc, source)
        return source
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = _FTYPE_F16
        params.allow_requantize = True
        params.nthread = os.cpu_count() or 1
        # llama.cpp logs a line per tensor through llama-cpp-python's logger; keep it quiet.
        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)
        status = llama_cpp.llama_model_quantize(
            str(source).encode(), partial.encode(), ctypes.byref(params)
        )
        if status != 0:
            raise OSError(f"llama_model_quantize returned {status}")
        os.replace(partial, target)
    except (AttributeError, OSError, TypeError, ValueError) as exc:
        log.warning("local model: could not derive an F16 copy (%s); using %s", exc, source)
        Path(partial).unlink(missing_ok=True)
        return source
    log.info("local model: derived %s from %s", target, source.name)
    return target
