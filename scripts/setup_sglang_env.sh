#!/usr/bin/env bash
# Create (or refresh) .venv-sglang: a separate virtual environment with SGLang's frontend
# modules, for `python -m dynamo.frontend --dyn-chat-processor sglang` and the tests marked
# `sglang`. It is large (torch), which is why it stays out of the default .venv-3.X.
#
#   scripts/setup_sglang_env.sh        # logs on stderr; the venv's python is the last stdout line
#
# Idempotent: a stamp file per step; a second run checks them (and which checkout the venv's
# `dynamo` package comes from) and returns.
#
# Environment:
#   SGLANG_VENV=path     where the venv goes (default: .venv-sglang in the checkout)
#   SGLANG_PYTHON=path   a Python 3.11 interpreter (default: pyenv's newest 3.11, else python3.11):
#                        the torch 2.14.1 and torchvision 0.29.1 wheels on this machine's disk
#                        are for 3.11
#
# What it installs, and why (measured on a 2-core, no-GPU machine; see docs/operator-guide.md):
#   * sglang==0.5.23 without its dependencies. A plain `pip install sglang` pulls ~70 packages
#     for its server and GPU kernels (flashinfer, sgl-kernel, ...): ~11 GB. The frontend uses
#     only its tokenizer loader, chat-template utilities, conversation registry, function-call
#     and reasoning parsers.
#   * what importing those modules needs, found by importing them (and building every parser of
#     SGLang's registries) in an empty venv until nothing was missing, pinned below. SGLang's own
#     pins where it has one (torch, transformers, tokenizers, openai, xgrammar, sentencepiece,
#     apache-tvm-ffi); the others at the release that was tested.
#   * torch==2.14.1 (SGLang's pin) with torchvision==0.29.1: `import sglang` imports torch, and
#     SGLang's model configs (imported by its tokenizer loader) import torchvision. PyPI has no
#     CPU build of that torchvision, so the CPU torch wheel does not serve: torch comes with its
#     CUDA libraries (unused here; most of the venv's size).
#   * then this project, editable, with its test extra.
set -euo pipefail
cd "$(dirname "$0")/.."

SGLANG_VERSION=0.5.23
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
# What SGLang's frontend modules import, beyond torch (see above). Keep in step with the list
# of modules in dynamo.frontend.processors.sglang_processor.SGLANG_MODULES.
SGLANG_FRONTEND_PACKAGES=(
  "transformers==5.19.0"
  "tokenizers==0.23.2"
  "openai==2.8.0"
  "xgrammar==0.2.7"
  "apache-tvm-ffi==0.1.11"
  "sentencepiece==0.2.1"
  "partial-json-parser==0.2.1.1.post7"
  "orjson==3.13.0"
  "msgspec==0.23.0"
  "pybase64==1.5.1"
  "pyzmq==27.3.0"
  "psutil==7.2.2"
  "requests==2.34.2"
  "aiohttp==3.14.5"
  "starlette==1.10.0"
  "pillow==13.0.0"
  "ipython==9.18.1"
  "dill==0.4.1"
)
VENV=${SGLANG_VENV:-.venv-sglang}
CHECKOUT=$(pwd -P)

log() { echo "setup_sglang_env: $*" >&2; }

# shellcheck source=scripts/python311.sh
. scripts/python311.sh

started_all=$SECONDS
create_venv311 "$VENV" SGLANG_PYTHON "the torch $TORCH_VERSION wheels on this disk are for 3.11"
pip=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)

# Step 1: SGLang, torch and the frontend modules' imports, keyed by the pinned set.
packages_key=$(printf '%s\n' "$SGLANG_VERSION" "$TORCH_VERSION" "$TORCHVISION_VERSION" \
  "${SGLANG_FRONTEND_PACKAGES[@]}" | cksum | cut -d' ' -f1)
engine_stamp="$VENV/.sglang-$SGLANG_VERSION-$packages_key"
if [ ! -f "$engine_stamp" ]; then
  started=$SECONDS
  log "installing torch==$TORCH_VERSION, torchvision==$TORCHVISION_VERSION and SGLang's frontend imports (minutes)"
  "${pip[@]}" install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" \
    "${SGLANG_FRONTEND_PACKAGES[@]}"
  log "installing sglang==$SGLANG_VERSION without its server and GPU dependencies"
  "${pip[@]}" install --no-deps "sglang==$SGLANG_VERSION"
  # Fail here, not in the tests, if the set stops being enough.
  "$VENV/bin/python" - >&2 <<'EOF'
import sglang
from sglang.srt.utils.hf_transformers_utils import get_tokenizer  # noqa: F401
from sglang.srt.parser.jinja_template_utils import detect_jinja_template_content_format  # noqa: F401
from sglang.srt.parser.conversation import chat_template_exists  # noqa: F401
from sglang.srt.function_call.function_call_parser import FunctionCallParser  # noqa: F401
from sglang.srt.function_call.json_array_parser import JsonArrayParser  # noqa: F401
from sglang.srt.parser.reasoning_parser import ReasoningParser  # noqa: F401
print("sglang", sglang.__version__, "imports the frontend modules")
EOF
  rm -f "$VENV"/.sglang-*
  touch "$engine_stamp"
  log "SGLang installed in $((SECONDS - started)) s; $VENV is $(du -sh "$VENV" | cut -f1)"
fi

# Step 2: this project's two distributions (the GC layer with its test extra, and the launchers),
# editable; redone when either pyproject.toml changes or
# when the venv's `dynamo` package is another checkout's (a venv shared between clones).
installed_from() {
  "$VENV/bin/python" -c 'import os, dynamo; print(os.path.realpath(list(dynamo.__path__)[0]))' \
    2>/dev/null || true
}
project_stamp="$VENV/.project-$(cat pyproject.toml components/pyproject.toml | cksum | cut -d' ' -f1)"
expected="$CHECKOUT/components/src/dynamo"
current=$(installed_from)
if [ ! -f "$project_stamp" ] || [ "$current" != "$expected" ]; then
  if [ -n "$current" ] && [ "$current" != "$expected" ]; then
    log "$VENV has dynamo from ${current%/components/src/dynamo}; re-installing from $CHECKOUT"
  fi
  log "installing this project (the GC layer with its test extra, and the launchers; editable)" \
    "into $VENV (pip then lists" \
    "SGLang's server and GPU dependencies as missing: they are left out on purpose)"
  # One editable install at a time per checkout (setuptools writes into the source tree).
  flock components/src "${pip[@]}" install -e ".[test]" -e ./components "torch==$TORCH_VERSION"
  rm -f "$VENV"/.project-*
  touch "$project_stamp"
fi

log "ready in $((SECONDS - started_all)) s: $VENV"
echo "$VENV/bin/python"
