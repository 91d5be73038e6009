# shellcheck shell=bash
# apt_install_missing PKG...: installs (without recommends) the packages not yet installed;
# does nothing, and touches no package index, when all are there. apt's and dpkg's output goes
# to stdout, which scripts/setup sends to the part's log.
apt_install_missing() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "apt: installing ${missing[*]}"
        apt_locked apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt_locked apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "apt: $* already installed"
    fi
}

# apt_locked CMD...: CMD while holding the project's apt lock. scripts/setup runs its parts in
# two lanes at once, and apt refuses to start (rather than wait) while another apt holds the
# dpkg or lists lock.
apt_locked() {
    local lock=${BANLIEUE_CACHE:-$HOME/.cache/banlieue}/apt.lock
    mkdir -p "$(dirname "$lock")"
    flock "$lock" "$@"
}
