# Shell helpers of scripts/* and .ci/run (sourced, not run).

# apt_install PKG...: install Debian packages, as root or through sudo
# (without either it does nothing; the caller checks what it needed).
apt_install() {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  fi
}

# need_tool WHO CMD PKG WHY: install PKG when CMD is missing; exit with a
# message saying what to install when it still is.
need_tool() {
  local who=$1 cmd=$2 pkg=$3 why=$4
  command -v "$cmd" >/dev/null 2>&1 && return 0
  echo "$who: installing $pkg ($why)" >&2
  apt_install "$pkg" || true
  command -v "$cmd" >/dev/null 2>&1 || {
    echo "$who: $cmd is missing and could not be installed; install it (apt-get install $pkg)" >&2
    exit 1
  }
}
