"""The packaged model's F16 copy (heed.llm.local_weights) and the prompt-thread rule.

Uses the real llama-cpp-python and the packaged GGUF, like tests/llm/test_local.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from heed.llm import local
from heed.llm.local import LocalProvider, llama_available, prefill_threads, resolve_model_path
from heed.llm.local_weights import f16_copy

pytestmark = pytest.mark.skipif(
    not llama_available() and os.environ.get("HEED_REQUIRE_LOCAL_MODEL") != "1",
    reason="llama-cpp-python is not installed: run scripts/install.sh",
)


@pytest.fixture(scope="module")
def llama_cpp() -> Any:
    import llama_cpp

    return llama_cpp


def test_derives_an_f16_copy_once_and_reuses_it(llama_cpp: Any, tmp_path: Path) -> None:
    source = resolve_model_path(None)
    copy = f16_copy(llama_cpp, source, tmp_path)
    assert copy != source and copy.parent == tmp_path and copy.suffix == ".gguf"
    assert copy.stat().st_size > 2 * source.stat().st_size  # 16 bits a weight against ~5
    assert [p.name for p in tmp_path.iterdir()] == [copy.name]  # no temporary file left
    made = copy.stat().st_mtime_ns
    again = f16_copy(llama_cpp, source, tmp_path)
    assert again == copy and again.stat().st_mtime_ns == made  # reused, not rewritten


def test_a_changed_source_gets_a_new_copy(llama_cpp: Any, tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(resolve_model_path(None).read_bytes())
    cache = tmp_path / "cache"
    first = f16_copy(llama_cpp, source, cache)
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    second = f16_copy(llama_cpp, source, cache)
    assert second != first and second.is_file()


def test_falls_back_to_the_source_when_the_cache_cannot_be_written(
    llama_cpp: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    source = resolve_model_path(None)
    with caplog.at_level("WARNING", logger="heed.llm"):
        assert f16_copy(llama_cpp, source, blocker / "models") == source
    assert "no F16 copy" in caplog.text


def test_falls_back_and_leaves_nothing_when_the_conversion_fails(
    llama_cpp: Any, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really a model")
    cache = tmp_path / "cache"
    assert f16_copy(llama_cpp, broken, cache) == broken
    assert list(cache.iterdir()) == []


async def test_the_packaged_model_runs_from_its_copy_and_a_named_file_as_given(
    tmp_path: Path,
) -> None:
    packaged = LocalProvider(cache_dir=tmp_path / "cache")
    named = LocalProvider(model=str(resolve_model_path(None)), cache_dir=tmp_path / "cache")
    try:
        await packaged.load()
        await named.load()
        assert packaged.weights_path.parent == tmp_path / "cache"
        assert named.weights_path == resolve_model_path(None)
    finally:
        for provider in (packaged, named):  # free these two; other tests keep the default
            with local._models_lock:
                loaded = local._models.pop(provider._spec, None)
            if loaded is not None:
                loaded.llm.close()


def test_weights_path_before_load_raises(tmp_path: Path) -> None:
    with pytest.raises(LookupError):
        _ = LocalProvider(cache_dir=tmp_path / "never-loaded").weights_path


@pytest.mark.parametrize(
    ("load", "expected"),
    [(0.0, "all"), (1.2, "all"), (1.6, "generation"), (3.0, "generation")],
)
def test_prompt_threads_take_every_core_only_while_one_is_spare(
    monkeypatch: pytest.MonkeyPatch, load: float, expected: str
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert prefill_threads(1) == (2 if expected == "all" else 1)


def test_prompt_threads_without_a_load_average(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> tuple[float, float, float]:
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert prefill_threads(1) == 1
