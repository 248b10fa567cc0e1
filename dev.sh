#!/usr/bin/env bash
# The project's two commands (icebox and test, as the README shows them) and helpers for
# contributors (lint, venv). Each sets itself up on a fresh clone (a virtual environment per Python
# version, with the package and its test and lint extras) and is harmless to run twice.
#
#   ./dev.sh icebox [args...]   start the "icebox" pair: a frontend and a mock worker on loopback,
#                               GC heaps frozen, pause logger on; Ctrl-C stops both
#   ./dev.sh test [pytest args] run the test suite, on every core (pytest-xdist's -n auto;
#                               `-n 0` runs it in this one process)
#   ./dev.sh lint               ruff (lint, format check) and mypy over components/, scripts/, tests/
#   ./dev.sh venv               only set up the virtual environment; prints its python
#   ./dev.sh help               this text
#
# PYTHON=/path/to/python3.X picks the interpreter (default: python3); each version gets its own
# .venv-3.X so switching is cheap.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}

ensure_venv() {
  local version venv stamp
  version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  # pyproject.toml's requires-python; docs/pythons.md says why 3.10 is no longer supported.
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "dev.sh: $PYTHON is Python $version; this project needs 3.11 or newer (docs/pythons.md)" >&2
    exit 2
  fi
  venv=".venv-$version"
  if [ ! -x "$venv/bin/python" ]; then
    echo "dev.sh: creating $venv with $PYTHON" >&2
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  fi
  # Reinstall only when the dependency declarations change (either distribution's).
  stamp="$venv/.installed-$(cat pyproject.toml components/pyproject.toml | cksum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ]; then
    echo "dev.sh: installing the GC layer (with the test and lint extras) and the launchers into $venv" >&2
    # One editable install at a time per checkout (CI builds several venvs at once): setuptools
    # writes its egg-info and build directories into the source tree.
    flock components/src \
      "$venv/bin/python" -m pip install --quiet -e ".[test,lint]" -e ./components >&2
    rm -f "$venv"/.installed-*
    touch "$stamp"
  fi
  VENV_PYTHON="$venv/bin/python"
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  icebox)
    ensure_venv
    exec "$VENV_PYTHON" scripts/icebox.py "$@"
    ;;
  test)
    ensure_venv
    echo "dev.sh: running the tests on $("$VENV_PYTHON" -V)" >&2
    set +e
    # Both cores by default (the arguments after it may say otherwise: a later -n wins); tests
    # that must not overlap share an xdist_group, which --dist loadgroup keeps on one worker.
    "$VENV_PYTHON" -m pytest -n auto --dist loadgroup "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then
      echo "dev.sh: no test ran; that is a failure" >&2
      exit 1
    fi
    exit "$rc"
    ;;
  venv)
    ensure_venv
    echo "$VENV_PYTHON"
    ;;
  lint)
    ensure_venv
    set +e
    rc=0
    "$VENV_PYTHON" -m ruff check components scripts tests || rc=1
    "$VENV_PYTHON" -m ruff format --check components scripts tests || rc=1
    "$VENV_PYTHON" -m mypy components/src/dynamo_gc components/src/dynamo scripts tests || rc=1
    set -e
    exit "$rc"
    ;;
  help|-h|--help)
    # The comment block at the top of this file, without its '#' (and nothing after it).
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
    exit 0
    ;;
  *)
    if [ -n "$command" ]; then
      echo "dev.sh: unknown command '$command'" >&2
    fi
    # The comment block at the top of this file, without its '#' (and nothing after it).
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" >&2
    exit 2
    ;;
esac
