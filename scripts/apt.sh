# Sourced by setup.sh and debs.sh: apt_install_missing WHO PACKAGE... installs with apt the
# packages that are not installed yet (as root, else with sudo), saying which.
apt_install_missing() {
  local who=$1 p
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "$who: installing ${#missing[@]} packages with apt (a few minutes the first time): ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "$who: packages installed"
}
