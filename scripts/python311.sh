# Sourced by the set-up scripts of the separate environments (vLLM, SGLang), whose torch wheels
# on this machine's disk are for Python 3.11. Defines find_python311.

# find_python311 VAR: the interpreter $VAR names, else pyenv's newest 3.11, else python3.11 on
# PATH; exits 2 (through the caller's `log`) when there is none.
find_python311() {
  local override=${!1:-}
  if [ -n "$override" ]; then
    echo "$override"
    return
  fi
  if command -v pyenv >/dev/null 2>&1; then
    local version
    version=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.11\.[0-9]+$' | sort -V | tail -n 1 || true)
    if [ -n "$version" ]; then
      echo "$(pyenv root)/versions/$version/bin/python"
      return
    fi
  fi
  if command -v python3.11 >/dev/null 2>&1; then
    command -v python3.11
    return
  fi
  log "no Python 3.11 found (pyenv or python3.11 on PATH); set $1"
  exit 2
}

# create_venv311 VENV VAR WHY: create the virtual environment VENV with the Python 3.11 that
# find_python311 VAR finds, unless it exists; exits 2 when that interpreter is not 3.11 (WHY:
# what needs 3.11).
create_venv311() {
  [ -x "$1/bin/python" ] && return
  local python
  python=$(find_python311 "$2")
  if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    log "$python is not Python 3.11 ($3)"
    exit 2
  fi
  log "creating $1 with $python"
  "$python" -m venv "$1"
}
