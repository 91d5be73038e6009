# shellcheck shell=bash
# A private apt state (sources, lists, preferences) derived from this machine's own Debian
# sources, so that extra suites (backports, trixie's deb-src) are reachable without touching
# /etc/apt and without any mirror host name written into the repository.
#
# Usage: source this file, then
#   apt_private_init NAME "TYPES" "SUITES" "COMPONENTS"   # e.g. deb-src trixie main
#   apt-get "${APT_PRIVATE_OPTS[@]}" update
# NAME keys a directory under ${BANLIEUE_CACHE:-~/.cache/banlieue}/apt/.

debian_mirror_uri() {
    local uri="" src
    # deb822 files first (Debian 12's default), then one-line lists; the first URI of a
    # binary-package entry that is not the security archive.
    for src in /etc/apt/sources.list.d/*.sources; do
        [[ -r $src ]] || continue
        uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$src")
        [[ -z $uri ]] || break
    done
    if [[ -z $uri ]]; then
        for src in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [[ -r $src ]] || continue
            uri=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$src")
            [[ -z $uri ]] || break
        done
    fi
    if [[ -z $uri ]]; then
        echo "error: cannot find a Debian mirror URI in /etc/apt/sources.list.d/*.sources, /etc/apt/sources.list or /etc/apt/sources.list.d/*.list" >&2
        return 1
    fi
    printf '%s\n' "$uri"
}

apt_private_init() {
    local name=$1 types=$2 suites=$3 components=$4
    local root="${BANLIEUE_CACHE:-$HOME/.cache/banlieue}/apt/$name"
    local uri
    uri=$(debian_mirror_uri) || return 1
    mkdir -p "$root/lists/partial" "$root/archives/partial" "$root/preferences.d"
    # The machine's own sources come first so dependencies resolve; the extra suite is added.
    {
        if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
            cat /etc/apt/sources.list.d/debian.sources
            echo
        fi
        printf 'Types: %s\nURIs: %s\nSuites: %s\nComponents: %s\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$types" "$uri" "$suites" "$components"
    } >"$root/sources.sources"
    APT_PRIVATE_ROOT=$root
    APT_PRIVATE_OPTS=(
        -o "Dir::Etc::sourcelist=$root/sources.sources"
        -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::lists=$root/lists"
        -o "Dir::Etc::preferencesparts=$root/preferences.d"
        -o "Dir::Cache::archives=$root/archives"
        -o "APT::Get::List-Cleanup=0"
    )
}
