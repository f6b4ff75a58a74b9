#!/usr/bin/env bash
# llama-cpp-python, for tests/surgery/test_gguf_llamacpp.py (the pruned GGUF run by llama.cpp, the program GGUF users run).
# PyPI has only its source (76 MB): pip compiles the vendored llama.cpp with cmake and the C/C++ compiler, and
# pip's wheel cache does not persist across CI runs, so this compiles every time.  The flags build the CPU backend
# only (AVX2/FMA/F16C baseline instead of -march=native, no BLAS) and leave out what the Python binding never
# loads: the multimodal library (mtmd/llava), curl and OpenSSL (model downloads), tests, tools, examples, server,
# and llama.cpp's "common" library (argument parsing, chat templates: half of the compile).  llama-cpp-python's
# CMakeLists forces LLAMA_BUILD_COMMON=ON in the cache; a project include (CMake's CMAKE_PROJECT_<name>_INCLUDE,
# run right after llama.cpp's project()) sets it OFF as a normal variable, which shadows the cache entry.
# Measured on the shared 2-core dev machine (compile CPU time, user+sys): 369 s with these flags, 728 s with
# common built; docs/exports.md "Checked by llama.cpp".
set -euo pipefail
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
if python3 -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON_VERSION')" 2>/dev/null; then
  echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION already installed"
  exit 0
fi
hook="$(mktemp --suffix=.cmake)"
trap 'rm -f "$hook"' EXIT
echo 'set(LLAMA_BUILD_COMMON OFF)' > "$hook"
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
-DCMAKE_PROJECT_llama.cpp_INCLUDE=$hook ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$(date +%s)
timeout 1500 python3 -m pip install -q --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
python3 -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'built and installed in', $(( $(date +%s) - start )), 's')"
