#!/usr/bin/env bash
# Turns on libvirt's TLS listener on this host, for banlieue's libvirt provider, which speaks
# to libvirt over mutual TLS only and authenticates with an x509 client certificate
# (auth_tls = "none": the certificate is the credential).
#
# The listener is libvirtd on a host running the monolithic daemon, virtproxyd on a host
# running libvirt's modular daemons (virtqemud and friends, with virtproxyd forwarding remote
# clients to them: the default on Fedora and RHEL 9). Which one is detected, or said with
# --daemons.
#
# It makes a private CA of its own (kept across runs, in a directory no other tool uses), a
# server certificate and a client certificate, puts the server's files where the daemon looks
# for them, writes libvirtd.conf or virtproxyd.conf (allowing that one client's DN), brings the
# listener up, and leaves the client's files in ~/.config/banlieue/libvirt/. Run it as root on
# the libvirt host; see --help.
set -euo pipefail
shopt -s extglob

readonly PROG=${0##*/}
readonly BLOCK_BEGIN="# BEGIN banlieue TLS listener (written by bootstrap-libvirt-tls.sh; edit outside this block)"
readonly BLOCK_END="# END banlieue TLS listener"
# The keys the managed block of libvirtd.conf or virtproxyd.conf owns; a setting of one of them
# elsewhere in the file is commented out, since the daemon would otherwise take whichever comes
# last.
readonly MANAGED_KEYS=(listen_tls tls_port listen_addr auth_tls ca_file cert_file key_file tls_allowed_dn_list)
readonly DEFAULT_TLS_PORT=16514
# The CA's own directory. Not /etc/pki/CA: that is the system-wide CA directory other tools
# (and an earlier admin) may hold a CA in, and signing libvirt clients with someone else's CA
# would let every certificate it ever issued reach libvirt.
readonly DEFAULT_CA_DIR=/etc/pki/banlieue-libvirt-ca

usage() {
    cat <<EOF
Usage: $PROG [OPTION]...

Enable libvirt's TLS listener (qemu+tls://HOST/system) for banlieue's libvirt provider.

Two kinds of libvirt host are supported; the script prints which one it chose and why:
  monolithic  libvirtd runs every driver and is the TLS listener itself, configured in
              /etc/libvirt/libvirtd.conf (Debian, Ubuntu, older distributions).
  modular     one daemon per driver (virtqemud for QEMU, ...) and virtproxyd, which listens
              for remote clients and forwards them to virtqemud; the TLS listener is
              virtproxyd, configured in /etc/libvirt/virtproxyd.conf (Fedora, RHEL 9 and
              derivatives). virtqemud's own configuration is not touched.
The choice, unless --daemons says it: with systemd, the units that are active, then those
that are enabled (libvirtd.service/.socket against virtqemud/virtproxyd .service/.socket);
otherwise, or when no unit tells, a running daemon (its pid file in /run), then which of
libvirtd and virtproxyd/virtqemud is installed, then which of libvirtd.conf and
virtproxyd.conf exists. When both kinds show at the same step the script stops and asks for
--daemons; when nothing shows, it assumes libvirtd.
The certificate paths below are the same for both daemons.

What it does, in order:
  1. Makes a certificate authority of its own, unless it exists (it is kept across runs):
       $DEFAULT_CA_DIR/cacert.pem            the CA certificate (ca_file)
       $DEFAULT_CA_DIR/private/cakey.pem     its private key, mode 600
     It never uses the system-wide /etc/pki/CA unless told to with --ca-dir /etc/pki/CA.
  2. Issues the server certificate the daemon presents, with the subject alternative names
     (SANs) this host's fully qualified name and short name plus every --san:
       /etc/pki/libvirt/servercert.pem
       /etc/pki/libvirt/private/serverkey.pem   mode 600
     An existing server certificate is kept when it was signed by the CA and names exactly
     these SANs; otherwise it is reissued.
  3. Issues a client certificate (subject CN from --client-cn) and writes, into the client
     directory (default ~/.config/banlieue/libvirt/, the home of \$SUDO_USER under sudo):
       cacert.pem  clientcert.pem  clientkey.pem       files mode 600, directory mode 700
     These are the names virsh reads from ?pkipath=DIR, and the files banlieue's credentials
     Secret (tls.crt, tls.key) and CA ConfigMap (ca.crt) are made from. The script refuses to
     write them inside a git work tree: they include a private key. Under sudo the directory
     must lie in the invoking user's home, since it is handed over to that user.
  4. Writes /etc/libvirt/libvirtd.conf (monolithic) or /etc/libvirt/virtproxyd.conf
     (modular): listen_tls = 1, auth_tls = "none", tls_port, listen_addr (with
     --listen-addr), the three file paths above, and tls_allowed_dn_list naming the client
     certificate's distinguished name (so only that client, not every certificate of the
     CA, is let in), in a marked block.
     Settings elsewhere in the file are kept, except earlier settings of those keys, which
     are commented out. When the file changes, the previous one is kept beside it as
     libvirtd.conf.bak.<UTC time> (virtproxyd.conf.bak.<UTC time>).
  5. Brings the listener up:
     - with systemd, monolithic: stops libvirtd.service, starts libvirtd.socket, enables
       and starts libvirtd-tls.socket, then starts libvirtd.service.
     - with systemd, modular: stops virtproxyd.service, enables and starts virtqemud.socket
       (virtproxyd forwards qemu:///system to it; virtqemud itself is not restarted),
       starts virtproxyd.socket, enables and starts virtproxyd-tls.socket, then starts
       virtproxyd.service.
       Under socket activation the daemon ignores listen_tls, listen_addr and tls_port
       (systemd owns the sockets), so a non-default --listen-addr or --tls-port is written
       as a drop-in, /etc/systemd/system/libvirtd-tls.socket.d/banlieue.conf
       (virtproxyd-tls.socket.d/banlieue.conf). A daemon whose main socket unit is masked
       opens its sockets itself and is restarted instead.
     - without systemd: prints the command to run (libvirtd --listen -f CONF -d, or
       virtproxyd -f CONF -d: virtproxyd has no --listen, it follows listen_tls).
     - with --no-restart or --root: prints the commands and touches no service.

Re-running is safe: the CA is kept, certificates still valid for the requested names are
kept, and an unchanged configuration file is not rewritten.

Options:
  --san NAME|IP        Add a subject alternative name to the server certificate; repeat
                       for several. Use every name and address clients will put in the URI
                       (qemu+tls://NAME/system): libvirt clients refuse a server whose
                       certificate does not name the host they dialled.
  --hostname NAME      The server certificate's common name and first DNS SAN: a DNS
                       name or an IP address (default: hostname -f, falling back to
                       hostname).
  --no-host-names      Leave this host's own names out of the SANs (only --san entries).
  --client-cn NAME     Common name of the client certificate (default: banlieue).
  --client-dir DIR     Where the client's files go (default ~/.config/banlieue/libvirt).
                       Under sudo it must be inside the invoking user's home.
  --ca-dir DIR         The CA's directory (cacert.pem, private/cakey.pem); default
                       $DEFAULT_CA_DIR. An existing CA there is used, so
                       naming another tool's CA directory here is a deliberate choice.
  --daemons monolithic|modular
                       Which daemon listens for TLS: libvirtd, or virtproxyd in front of
                       virtqemud (default: detected, as described above).
  --listen-addr ADDR   Address the TLS listener binds (default: every address).
  --tls-port PORT      TCP port of the TLS listener (default: $DEFAULT_TLS_PORT).
  --days N             Validity of new certificates, in days (default: 3650).
  --tool certtool|openssl
                       Which tool makes keys and certificates (default: certtool, from
                       gnutls-bin, when installed, else openssl).
  --force              Make a new CA and new certificates even when valid ones exist (in
                       the --ca-dir directory).
                       Every client certificate the old CA signed stops working.
  --no-restart         Write files only; print the commands that bring the listener up.
  --root DIR           Test mode: every /etc path is taken under DIR/etc and the home
                       directory is DIR/home; implies --no-restart. File contents (the
                       paths in libvirtd.conf) name the relocated files, so a daemon can
                       be started on them: libvirtd --listen -f DIR/etc/libvirt/libvirtd.conf
                       (or virtproxyd -f DIR/etc/libvirt/virtproxyd.conf). Detection then
                       looks inside DIR only, never at systemd: pid files in DIR/run,
                       programs in DIR/usr/sbin (and bin, /sbin, /usr/local/sbin),
                       configuration files in DIR/etc/libvirt.
  -h, --help           Show this help.

Afterwards, from the machine holding the client files:
  virsh -c "qemu+tls://HOST/system?pkipath=\$HOME/.config/banlieue/libvirt" version
If that hangs instead of failing, a firewall is usually dropping the TLS port.
EOF
}

die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

note() {
    echo "$PROG: $*"
}

# --- arguments ---------------------------------------------------------------------------

root=""
sans=()
host_name=""
host_names=1
client_cn="banlieue"
client_dir=""
ca_dir=""
listen_addr=""
tls_port=""
days=3650
tool=""
force=0
restart=1
daemons=""

need_value() {
    if (($# < 2)) || [[ -z $2 ]]; then
        die "option $1 needs a value (see --help)"
    fi
}

while (($#)); do
    case $1 in
    --san) need_value "$@"; sans+=("$2"); shift 2 ;;
    --san=*) sans+=("${1#*=}"); shift ;;
    --hostname) need_value "$@"; host_name=$2; shift 2 ;;
    --hostname=*) host_name=${1#*=}; shift ;;
    --no-host-names) host_names=0; shift ;;
    --client-cn) need_value "$@"; client_cn=$2; shift 2 ;;
    --client-cn=*) client_cn=${1#*=}; shift ;;
    --client-dir) need_value "$@"; client_dir=$2; shift 2 ;;
    --client-dir=*) client_dir=${1#*=}; shift ;;
    --ca-dir) need_value "$@"; ca_dir=$2; shift 2 ;;
    --ca-dir=*) ca_dir=${1#*=}; shift ;;
    --daemons) need_value "$@"; daemons=$2; shift 2 ;;
    --daemons=*) daemons=${1#*=}; shift ;;
    --listen-addr) need_value "$@"; listen_addr=$2; shift 2 ;;
    --listen-addr=*) listen_addr=${1#*=}; shift ;;
    --tls-port) need_value "$@"; tls_port=$2; shift 2 ;;
    --tls-port=*) tls_port=${1#*=}; shift ;;
    --days) need_value "$@"; days=$2; shift 2 ;;
    --days=*) days=${1#*=}; shift ;;
    --tool) need_value "$@"; tool=$2; shift 2 ;;
    --tool=*) tool=${1#*=}; shift ;;
    --force) force=1; shift ;;
    --no-restart) restart=0; shift ;;
    --root) need_value "$@"; root=$2; shift 2 ;;
    --root=*) root=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

if [[ -n $tls_port ]]; then
    if ! [[ $tls_port =~ ^[0-9]+$ ]] || ((tls_port < 1 || tls_port > 65535)); then
        die "--tls-port must be a port number, got '$tls_port'"
    fi
fi
if ! [[ $days =~ ^[0-9]+$ ]] || ((days == 0)); then
    die "--days must be a positive number, got '$days'"
fi
[[ $client_cn =~ ^[A-Za-z0-9._@-]+$ ]] || die "--client-cn may hold letters, digits and . _ @ - only"
case $daemons in
"" | monolithic | modular) ;;
*) die "--daemons must be monolithic or modular, got '$daemons'" ;;
esac
if [[ -n $listen_addr && ! $listen_addr =~ ^[0-9A-Za-z.:_-]+$ ]]; then
    die "--listen-addr must be an address or host name, got '$listen_addr'"
fi

case $tool in
"") if command -v certtool >/dev/null; then tool=certtool; elif command -v openssl >/dev/null; then tool=openssl; else
    die "neither certtool (Debian package gnutls-bin) nor openssl is installed"
fi ;;
certtool | openssl) command -v "$tool" >/dev/null || die "$tool is not installed" ;;
*) die "--tool must be certtool or openssl, got '$tool'" ;;
esac

if [[ -n $root ]]; then
    mkdir -p "$root"
    root=$(cd "$root" && pwd)
    restart=0
fi

# --- paths -------------------------------------------------------------------------------

etc="$root/etc"
explicit_ca_dir=0
[[ -z $ca_dir ]] || explicit_ca_dir=1
case ${ca_dir:-$DEFAULT_CA_DIR} in
/*) ca_dir="$root${ca_dir:-$DEFAULT_CA_DIR}" ;;
*) die "--ca-dir must be an absolute path, got '$ca_dir'" ;;
esac
ca_cert="$ca_dir/cacert.pem"
ca_key="$ca_dir/private/cakey.pem"
server_cert="$etc/pki/libvirt/servercert.pem"
server_key="$etc/pki/libvirt/private/serverkey.pem"

# Whose home the client files go to: under sudo, the invoking user's, so that they end up
# with the person who will build the Kubernetes Secret from them.
client_owner=""
if [[ -n ${SUDO_USER:-} && $SUDO_USER != root && $EUID -eq 0 ]]; then
    client_owner=$SUDO_USER
fi
if [[ -n $root ]]; then
    home="$root/home"
elif [[ -n $client_owner ]]; then
    home=$(getent passwd "$client_owner" | cut -d: -f6)
    [[ -n $home ]] || die "cannot find the home directory of $client_owner"
else
    home=${HOME:?HOME is not set}
fi
client_dir=${client_dir:-$home/.config/banlieue/libvirt}
case $client_dir in /*) ;; *) client_dir="$PWD/$client_dir" ;; esac
# Symbolic links and .. resolved, so the checks below judge where the files really go.
client_dir=$(realpath -m -- "$client_dir")

# --- checks before anything is written ---------------------------------------------------

# The nearest ancestor of $1 (itself included) that exists.
existing_ancestor() {
    local p=$1
    while [[ ! -e $p ]]; do p=$(dirname "$p"); done
    printf '%s\n' "$p"
}

# Succeeds when $1 lies inside a git work tree (a .git directory or file in it or above it).
inside_git_work_tree() {
    local p
    p=$(cd "$(existing_ancestor "$1")" && pwd -P)
    while :; do
        [[ -e $p/.git ]] && return 0
        [[ $p == / ]] && return 1
        p=$(dirname "$p")
    done
}

# Handing a directory over to the invoking user is only safe inside that user's own home:
# elsewhere (/etc, another user's home) it would give them files they must not own.
if [[ -n $client_owner ]]; then
    real_home=$(realpath -m -- "$home")
    if [[ $client_dir != "$real_home"/* ]]; then
        die "refusing --client-dir $client_dir: under sudo the client's files are handed to $client_owner, so they must go inside $real_home"
    fi
fi

if inside_git_work_tree "$client_dir"; then
    die "refusing to write the client's private key into a git work tree ($client_dir); pass --client-dir with a directory outside any repository"
fi

if [[ -z $root && $EUID -ne 0 ]]; then
    die "run as root (it writes under /etc/pki and /etc/libvirt), or use --root DIR to write elsewhere"
fi

# --- the server certificate's names ------------------------------------------------------

is_ip() {
    [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $1 == *:* ]]
}

explicit_host_name=0
[[ -z $host_name ]] || explicit_host_name=1
if [[ -z $host_name ]]; then
    host_name=$(hostname -f 2>/dev/null || true)
    [[ -n $host_name ]] || host_name=$(hostname)
fi
# The name goes into certificate templates and libvirtd.conf between quotes: anything but a
# DNS name or an IP address could add directives of its own (a quote and "ca" would make the
# server certificate a CA).
is_dns_name() {
    local label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
    ((${#1} <= 253)) && [[ $1 =~ ^$label(\.$label)*$ ]]
}
is_ip_address() {
    [[ $1 =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}$ || $1 =~ ^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$ ]]
}
if ! is_dns_name "$host_name" && ! is_ip_address "$host_name"; then
    if ((explicit_host_name)); then
        die "--hostname must be a DNS name or an IP address, got '$host_name'"
    fi
    die "this host's name '$host_name' is neither a DNS name nor an IP address; pass --hostname"
fi
san_list=()
add_san() {
    local s
    [[ -n $1 ]] || return 0
    for s in "${san_list[@]}"; do [[ $s == "$1" ]] && return 0; done
    san_list+=("$1")
}
if ((host_names)); then
    add_san "$host_name"
    add_san "$(hostname 2>/dev/null || true)"
fi
for s in "${sans[@]}"; do
    [[ $s =~ ^[A-Za-z0-9.:*_-]+$ ]] || die "--san '$s' is neither a host name nor an IP address"
    add_san "$s"
done
((${#san_list[@]})) || die "no subject alternative names (--no-host-names needs at least one --san)"
# With --no-host-names and no --hostname, the common name is the first SAN.
((host_names || explicit_host_name)) || host_name=${san_list[0]}

# An IPv6 address in one spelling (eight lower-case groups without leading zeros), since
# certtool prints ::1 where openssl prints 0:0:0:0:0:0:0:1.
ipv6_canonical() {
    local a=${1,,} head tail groups=() out=() g n i
    if [[ $a == *::* ]]; then
        head=${a%%::*} tail=${a#*::}
        local h=() t=()
        [[ -z $head ]] || IFS=: read -ra h <<<"$head"
        [[ -z $tail ]] || IFS=: read -ra t <<<"$tail"
        n=$((8 - ${#h[@]} - ${#t[@]}))
        groups=("${h[@]}")
        for ((i = 0; i < n; i++)); do groups+=(0); done
        groups+=("${t[@]}")
    else
        IFS=: read -ra groups <<<"$a"
    fi
    for g in "${groups[@]}"; do
        g=${g##+(0)}
        out+=("${g:-0}")
    done
    (IFS=:; echo "${out[*]}")
}

# Lines "DNS:name" / "IP:addr" on stdin, made comparable: sorted, IPv6 in one spelling.
canonical_sans() {
    local line
    while IFS= read -r line; do
        [[ -n $line ]] || continue
        if [[ $line == IP:*:* ]]; then echo "IP:$(ipv6_canonical "${line#IP:}")"; else echo "$line"; fi
    done | LC_ALL=C sort -u
}

requested_sans() {
    local s
    for s in "${san_list[@]}"; do
        if is_ip "$s"; then echo "IP:$s"; else echo "DNS:$s"; fi
    done | canonical_sans
}

# --- which daemon listens: monolithic libvirtd or modular virtproxyd ---------------------

systemd_running() {
    [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null
}

# unit_state is-active|is-enabled UNIT: what systemctl says (active, enabled, masked, ...),
# nothing for a unit it does not know.
unit_state() {
    systemctl "$1" "$2" 2>/dev/null || true
}

# first_unit is-active|is-enabled UNIT...: the first UNIT that is active (enabled).
first_unit() {
    local verb=$1 unit state
    shift
    for unit in "$@"; do
        state=$(unit_state "$verb" "$unit")
        case $verb:$state in
        is-active:active | is-enabled:enabled | is-enabled:enabled-runtime)
            printf '%s\n' "$unit"
            return
            ;;
        esac
    done
}

# running_daemon NAME: "NAME is running (pid N, PIDFILE)" when the pid file the daemon writes
# by default names a live process of that name.
running_daemon() {
    local pid_file="$root/run/$1.pid" pid
    [[ -r $pid_file ]] || return 0
    pid=$(head -c 32 "$pid_file" | tr -dc 0-9)
    [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] || return 0
    printf '%s is running (pid %s, %s)\n' "$1" "$pid" "$pid_file"
}

# installed_program NAME: its path, where distributions put the daemons.
installed_program() {
    local dir
    for dir in /usr/sbin /usr/bin /sbin /usr/local/sbin; do
        if [[ -x $root$dir/$1 ]]; then
            printf '%s\n' "$root$dir/$1"
            return
        fi
    done
}

# decide MONOLITHIC_EVIDENCE MODULAR_EVIDENCE: sets mode and why from one step of detection;
# fails when that step showed neither kind.
decide() {
    if [[ -n $1 && -n $2 ]]; then
        die "cannot tell which libvirt daemons this host runs: $1, and $2; pass --daemons monolithic (libvirtd) or --daemons modular (virtproxyd + virtqemud)"
    elif [[ -n $1 ]]; then
        mode=monolithic why="since $1"
    elif [[ -n $2 ]]; then
        mode=modular why="since $2"
    else
        return 1
    fi
}

detect_daemons() {
    local mono modu
    if [[ -n $daemons ]]; then
        mode=$daemons why="as --daemons says"
        return
    fi
    # What systemd runs, then what it would start at boot. Never under --root: that tree is
    # not the host systemd manages.
    if [[ -z $root ]] && systemd_running; then
        mono=$(first_unit is-active libvirtd.service libvirtd.socket)
        modu=$(first_unit is-active virtproxyd.service virtproxyd.socket virtqemud.service virtqemud.socket)
        decide "${mono:+$mono is active}" "${modu:+$modu is active}" && return
        mono=$(first_unit is-enabled libvirtd.service libvirtd.socket)
        modu=$(first_unit is-enabled virtproxyd.socket virtqemud.socket virtproxyd.service virtqemud.service)
        decide "${mono:+$mono is enabled}" "${modu:+$modu is enabled}" && return
    fi
    # A daemon started some other way (an init script, by hand).
    mono=$(running_daemon libvirtd)
    modu=$(running_daemon virtproxyd)
    [[ -n $modu ]] || modu=$(running_daemon virtqemud)
    decide "$mono" "$modu" && return
    # Which daemons are installed, then which are configured.
    mono=$(installed_program libvirtd)
    modu=$(installed_program virtproxyd)
    [[ -n $modu ]] || modu=$(installed_program virtqemud)
    decide "${mono:+$mono is installed}" "${modu:+$modu is installed}" && return
    mono="" modu=""
    [[ ! -e $etc/libvirt/libvirtd.conf ]] || mono="$etc/libvirt/libvirtd.conf exists"
    [[ ! -e $etc/libvirt/virtproxyd.conf ]] || modu="$etc/libvirt/virtproxyd.conf exists"
    decide "$mono" "$modu" && return
    mode=monolithic why="assumed: no libvirt daemon is running, installed or configured here (pass --daemons modular for virtproxyd)"
}

mode="" why=""
detect_daemons
if [[ $mode == modular ]]; then
    # virtproxyd listens for remote clients and forwards qemu:///system to virtqemud.
    daemon=virtproxyd
    mode_name="modular (virtproxyd + virtqemud)"
else
    daemon=libvirtd
    mode_name="monolithic (libvirtd)"
fi
conf="$etc/libvirt/$daemon.conf"
socket_dropin="$etc/systemd/system/$daemon-tls.socket.d/banlieue.conf"
note "daemons: $mode_name, $why; TLS settings go in $conf"

# --- key and certificate making ----------------------------------------------------------

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# make_key OUT
make_key() {
    (
        umask 077
        if [[ $tool == certtool ]]; then
            certtool --generate-privkey --key-type rsa --bits 3072 --outfile "$1" 2>/dev/null
        else
            openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:3072 -out "$1" 2>/dev/null
        fi
    )
}

# make_ca KEY CERT
make_ca() {
    local cn="banlieue libvirt CA ($host_name)"
    if [[ $tool == certtool ]]; then
        cat >"$work/ca.tmpl" <<EOF
cn = "$cn"
ca
cert_signing_key
crl_signing_key
expiration_days = $days
EOF
        certtool --generate-self-signed --load-privkey "$1" --template "$work/ca.tmpl" \
            --outfile "$2" 2>/dev/null
    else
        openssl req -x509 -new -key "$1" -subj "/CN=$cn" -days "$days" -sha256 \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -addext "subjectKeyIdentifier=hash" -out "$2" 2>/dev/null
    fi
}

# make_leaf server|client CN KEY CERT
make_leaf() {
    local role=$1 cn=$2 key=$3 cert=$4 s
    if [[ $tool == certtool ]]; then
        {
            echo "organization = \"banlieue\""
            echo "cn = \"$cn\""
            if [[ $role == server ]]; then
                for s in "${san_list[@]}"; do
                    if is_ip "$s"; then echo "ip_address = \"$s\""; else echo "dns_name = \"$s\""; fi
                done
                echo "tls_www_server"
            else
                echo "tls_www_client"
            fi
            echo "signing_key"
            echo "encryption_key"
            echo "expiration_days = $days"
        } >"$work/$role.tmpl"
        certtool --generate-certificate --load-privkey "$key" \
            --load-ca-certificate "$ca_cert" --load-ca-privkey "$ca_key" \
            --template "$work/$role.tmpl" --outfile "$cert" 2>/dev/null
    else
        {
            echo "basicConstraints = critical,CA:FALSE"
            echo "keyUsage = critical,digitalSignature,keyEncipherment"
            echo "subjectKeyIdentifier = hash"
            echo "authorityKeyIdentifier = keyid"
            if [[ $role == server ]]; then
                echo "extendedKeyUsage = serverAuth"
                local alt=() i=0
                for s in "${san_list[@]}"; do
                    i=$((i + 1))
                    if is_ip "$s"; then alt+=("IP.$i = $s"); else alt+=("DNS.$i = $s"); fi
                done
                echo "subjectAltName = @alt"
                echo "[alt]"
                printf '%s\n' "${alt[@]}"
            else
                echo "extendedKeyUsage = clientAuth"
            fi
        } >"$work/$role.ext"
        openssl req -new -key "$key" -subj "/O=banlieue/CN=$cn" -out "$work/$role.csr" 2>/dev/null
        openssl x509 -req -in "$work/$role.csr" -CA "$ca_cert" -CAkey "$ca_key" \
            -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
            -extfile "$work/$role.ext" -out "$cert" 2>/dev/null
    fi
}

# Succeeds when CERT was signed by the CA in place.
signed_by_ca() {
    if [[ $tool == certtool ]]; then
        certtool --verify --load-ca-certificate "$ca_cert" --infile "$1" >/dev/null 2>&1
    else
        openssl verify -CAfile "$ca_cert" "$1" >/dev/null 2>&1
    fi
}

# The SANs in CERT, in the form requested_sans prints.
cert_sans() {
    if [[ $tool == certtool ]]; then
        certtool -i --infile "$1" 2>/dev/null |
            sed -n -e 's/^[[:space:]]*DNSname: \(.*\)$/DNS:\1/p' -e 's/^[[:space:]]*IPAddress: \(.*\)$/IP:\1/p'
    else
        openssl x509 -in "$1" -noout -ext subjectAltName 2>/dev/null | tail -n +2 |
            tr ',' '\n' | sed -e 's/^[[:space:]]*//' -e 's/^IP Address:/IP:/'
    fi | canonical_sans
}

# The subject DN of CERT as libvirtd compares it with tls_allowed_dn_list (what
# virt-pki-query-dn prints: RDNs in certificate order, comma-separated).
cert_dn() {
    if command -v virt-pki-query-dn >/dev/null; then
        virt-pki-query-dn "$1" 2>/dev/null
    elif command -v openssl >/dev/null; then
        openssl x509 -in "$1" -noout -subject -nameopt RFC2253,-dn_rev 2>/dev/null | sed 's/^subject=//'
    else
        # certtool prints RFC 4514 order, the reverse of the certificate's.
        certtool -i --infile "$1" 2>/dev/null | sed -n 's/^[[:space:]]*Subject: //p' |
            tr ',' '\n' | tac | paste -sd, -
    fi
}

# install_file SRC DEST MODE: atomically, creating DEST's directory.
install_file() {
    local dir
    dir=$(dirname "$2")
    mkdir -p "$dir"
    install -m "$3" "$1" "$2.new.$$"
    mv -f "$2.new.$$" "$2"
}

# --- 1. the CA ---------------------------------------------------------------------------

new_ca=0
if ((!explicit_ca_dir)) && [[ ! -e $ca_cert && -e $root/etc/pki/CA/cacert.pem ]]; then
    note "not using the CA in $root/etc/pki/CA: this script keeps its own in $ca_dir (pass --ca-dir $root/etc/pki/CA to sign with that one instead)"
fi
if ((force)) || [[ ! -e $ca_cert && ! -e $ca_key ]]; then
    mkdir -p "$(dirname "$ca_cert")" "$(dirname "$ca_key")"
    chmod 700 "$(dirname "$ca_key")"
    make_key "$work/cakey.pem"
    # The CA's own files are written before they are used to sign anything below.
    install_file "$work/cakey.pem" "$ca_key" 600
    make_ca "$ca_key" "$work/cacert.pem"
    install_file "$work/cacert.pem" "$ca_cert" 644
    new_ca=1
    note "made a new CA: $ca_cert"
elif [[ ! -e $ca_key ]]; then
    die "$ca_cert exists but its key $ca_key does not; this script cannot sign with a CA it does not hold (pass --force to replace that CA, which invalidates every certificate it signed)"
elif [[ ! -e $ca_cert ]]; then
    die "$ca_key exists but $ca_cert does not; restore it, or pass --force to make a new CA"
else
    note "keeping the existing CA: $ca_cert"
fi

# --- 2. the server certificate -----------------------------------------------------------

reissue_server=$((force || new_ca))
if ((!reissue_server)); then
    if [[ ! -e $server_cert || ! -e $server_key ]]; then
        reissue_server=1
    elif ! signed_by_ca "$server_cert"; then
        note "the server certificate was not signed by this CA: reissuing it"
        reissue_server=1
    elif [[ $(cert_sans "$server_cert") != "$(requested_sans)" ]]; then
        note "the server certificate names other hosts: reissuing it"
        reissue_server=1
    fi
fi
if ((reissue_server)); then
    mkdir -p "$(dirname "$server_key")"
    chmod 700 "$(dirname "$server_key")"
    make_key "$work/serverkey.pem"
    make_leaf server "$host_name" "$work/serverkey.pem" "$work/servercert.pem"
    install_file "$work/serverkey.pem" "$server_key" 600
    install_file "$work/servercert.pem" "$server_cert" 644
    note "issued the server certificate for: ${san_list[*]}"
else
    note "keeping the server certificate for: ${san_list[*]}"
fi

# --- 3. the client certificate -----------------------------------------------------------

client_cert="$client_dir/clientcert.pem"
client_key="$client_dir/clientkey.pem"
mkdir -p "$client_dir"
chmod 700 "$client_dir"
reissue_client=$((force || new_ca))
if ((!reissue_client)); then
    if [[ ! -e $client_cert || ! -e $client_key ]] || ! signed_by_ca "$client_cert"; then
        reissue_client=1
    elif [[ $(cert_dn "$client_cert") != "O=banlieue,CN=$client_cn" ]]; then
        note "the client certificate names another client: reissuing it"
        reissue_client=1
    fi
fi
if ((reissue_client)); then
    make_key "$work/clientkey.pem"
    make_leaf client "$client_cn" "$work/clientkey.pem" "$work/clientcert.pem"
    install_file "$work/clientkey.pem" "$client_key" 600
    install_file "$work/clientcert.pem" "$client_cert" 600
    note "issued the client certificate (CN=$client_cn)"
else
    note "keeping the client certificate"
fi
install_file "$ca_cert" "$client_dir/cacert.pem" 600
chmod 600 "$client_key" "$client_cert"
client_dn=$(cert_dn "$client_cert")
[[ -n $client_dn ]] || die "cannot read the distinguished name of $client_cert"
if [[ -n $client_owner ]]; then
    # Only what this script wrote, never through a link: not chown -R, which would also hand
    # over whatever else the directory holds (a hard link to a root-owned file, say).
    chown -h "$client_owner:" "$client_dir" "$client_dir/cacert.pem" "$client_cert" "$client_key"
    # The parents made here belong to the user too, not to root.
    real_home=$(realpath -m -- "$home")
    p=$(dirname "$client_dir")
    while [[ $p == "$real_home"/* ]]; do
        [[ $(stat -c %U "$p") == root ]] && chown -h "$client_owner:" "$p"
        p=$(dirname "$p")
    done
fi

# --- 4. libvirtd.conf or virtproxyd.conf ------------------------------------------------

quote() {
    local v=${1//\\/\\\\}
    printf '"%s"' "${v//\"/\\\"}"
}

{
    echo "$BLOCK_BEGIN"
    echo "listen_tls = 1"
    echo "tls_port = $(quote "${tls_port:-$DEFAULT_TLS_PORT}")"
    [[ -z $listen_addr ]] || echo "listen_addr = $(quote "$listen_addr")"
    # The client's x509 certificate, checked against ca_file, is the only credential.
    echo "auth_tls = \"none\""
    echo "ca_file = $(quote "$ca_cert")"
    echo "cert_file = $(quote "$server_cert")"
    echo "key_file = $(quote "$server_key")"
    # Only the client issued here: a certificate the CA signed for anything else is refused.
    echo "tls_allowed_dn_list = [ $(quote "$client_dn") ]"
    echo "$BLOCK_END"
} >"$work/block"

# The existing file without the previous block, with other settings of the managed keys
# commented out, then the new block.
if [[ -e $conf ]]; then
    awk -v begin="$BLOCK_BEGIN" -v end="$BLOCK_END" -v keys="${MANAGED_KEYS[*]}" '
        BEGIN { n = split(keys, k, " "); for (i = 1; i <= n; i++) managed[k[i]] = 1 }
        $0 == begin { skipping = 1; next }
        skipping && $0 == end { skipping = 0; next }
        skipping { next }
        {
            if (match($0, /^[ \t]*[a-z_]+[ \t]*=/)) {
                key = substr($0, RSTART, RLENGTH - 1); gsub(/[ \t]/, "", key)
                if (key in managed) { print "#(banlieue) " $0; next }
            }
            print
        }' "$conf" >"$work/$daemon.conf"
    # No blank line piles up between re-runs, and none leads a file that holds only the block.
    sed -i -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$work/$daemon.conf"
    [[ ! -s $work/$daemon.conf ]] || echo >>"$work/$daemon.conf"
fi
cat "$work/block" >>"$work/$daemon.conf"

if [[ -e $conf ]] && cmp -s "$conf" "$work/$daemon.conf"; then
    note "$conf already has the TLS listener settings"
else
    mkdir -p "$(dirname "$conf")"
    if [[ -e $conf ]]; then
        backup="$conf.bak.$(date -u +%Y%m%dT%H%M%SZ)"
        cp -p "$conf" "$backup"
        note "kept the previous configuration as $backup"
    fi
    install_file "$work/$daemon.conf" "$conf" 644
    note "wrote $conf"
fi

# Under socket activation systemd owns the listening socket, so a non-default address or port
# has to be said to systemd; the unit's own default is port 16514 on every address.
dropin_changed=0
if [[ -n $listen_addr || (-n $tls_port && $tls_port != "$DEFAULT_TLS_PORT") ]]; then
    listen_stream=${tls_port:-$DEFAULT_TLS_PORT}
    if [[ -n $listen_addr ]]; then
        if [[ $listen_addr == *:* ]]; then listen_stream="[$listen_addr]:$listen_stream"; else listen_stream="$listen_addr:$listen_stream"; fi
    fi
    printf '# Written by bootstrap-libvirt-tls.sh: the TLS listener under socket activation.\n[Socket]\nListenStream=\nListenStream=%s\n' \
        "$listen_stream" >"$work/dropin"
    if ! cmp -s "$work/dropin" "$socket_dropin" 2>/dev/null; then
        install_file "$work/dropin" "$socket_dropin" 644
        dropin_changed=1
        note "wrote $socket_dropin (ListenStream=$listen_stream)"
    fi
elif [[ -e $socket_dropin ]]; then
    rm -f "$socket_dropin"
    dropin_changed=1
    note "removed $socket_dropin (back to the unit's default listener)"
fi

# --- 5. the listener ---------------------------------------------------------------------

# How the daemon is started without systemd: libvirtd listens on TCP only with --listen;
# virtproxyd has no such option and follows listen_tls in its configuration file.
if [[ $mode == modular ]]; then
    start_command="virtproxyd -f $conf -d"
else
    start_command="libvirtd --listen -f $conf -d"
fi

# The systemctl steps, one per line, that bring the TLS listener up under socket activation.
# The daemon takes its sockets from systemd only when it starts, and DAEMON-tls.socket is
# bound to, and ordered after, DAEMON.socket: so the service goes down, the sockets come up,
# and the service starts last with all of them.
socket_steps() {
    ((dropin_changed)) && echo "daemon-reload"
    echo "stop $daemon.service"
    if [[ $mode == modular ]]; then
        # virtproxyd forwards qemu:///system to virtqemud's socket, which starts virtqemud on
        # demand; a running virtqemud, and its guests, are left alone.
        echo "enable virtqemud.socket"
        echo "start virtqemud.socket"
    fi
    echo "start $daemon.socket"
    echo "enable $daemon-tls.socket"
    echo "restart $daemon-tls.socket"
    echo "start $daemon.service"
}

print_manual_steps() {
    local step
    echo
    echo "Nothing was restarted. To bring the TLS listener up:"
    echo "  with systemd (socket activation; sockets first, then the service):"
    while IFS= read -r step; do
        echo "    systemctl $step"
    done < <(socket_steps)
    if [[ $mode == modular ]]; then
        echo "  without systemd (virtqemud running; stop a running virtproxyd first):"
    else
        echo "  without systemd (stop a running libvirtd first):"
    fi
    echo "    $start_command"
}

bring_up_with_systemd() {
    local args_file unit step steps=()
    if ! systemctl cat "$daemon.service" >/dev/null 2>&1; then
        if [[ $mode == modular ]]; then
            die "virtproxyd.service is not installed; with libvirt's modular daemons it is the TLS listener (on Fedora and RHEL: dnf install libvirt-daemon-proxy), or run again with --daemons monolithic if this host runs libvirtd"
        fi
        die "libvirtd.service is not installed; if this host runs libvirt's modular daemons (virtqemud), run again with --daemons modular to set up virtproxyd"
    fi
    if [[ $mode == modular ]]; then
        systemctl cat virtqemud.service >/dev/null 2>&1 ||
            die "virtqemud.service is not installed; virtproxyd forwards qemu:///system to it (on Fedora and RHEL: dnf install libvirt-daemon-driver-qemu)"
        # virtproxyd.service is bound to its socket units (unlike libvirtd.service, which
        # only wants them), so it has no mode without socket activation under systemd.
        for unit in virtproxyd.socket virtproxyd-tls.socket virtqemud.socket; do
            if [[ $(unit_state is-enabled "$unit") == masked ]]; then
                die "$unit is masked, and the modular daemons run only under socket activation with systemd: systemctl unmask $unit, then run again"
            fi
        done
        for args_file in /etc/default/virtproxyd /etc/sysconfig/virtproxyd; do
            if [[ -e $args_file ]] && grep -Eq '^[[:space:]]*VIRTPROXYD_ARGS=.*--listen' "$args_file"; then
                die "$args_file passes --listen, which virtproxyd does not accept; remove it and run again"
            fi
        done
        if [[ $(unit_state is-enabled libvirtd-tls.socket) == enabled ]]; then
            note "warning: libvirtd-tls.socket is enabled too; it conflicts with virtproxyd-tls.socket and would take the TLS port at boot: systemctl disable libvirtd-tls.socket"
        fi
    elif [[ $(unit_state is-enabled libvirtd.socket) == masked ]]; then
        # Traditional mode under systemd: libvirtd opens its own sockets, so it reads
        # listen_tls and needs --listen on its command line.
        for args_file in /etc/default/libvirtd /etc/sysconfig/libvirtd; do
            if [[ -e $args_file ]] && ! grep -Eq '^[[:space:]]*LIBVIRTD_ARGS=.*(--listen|-l\b)' "$args_file"; then
                note "warning: libvirtd.socket is masked, so libvirtd opens its sockets itself and needs --listen: add it to LIBVIRTD_ARGS in $args_file"
            fi
        done
        note "systemctl restart libvirtd.service"
        systemctl restart libvirtd.service
        return
    else
        for args_file in /etc/default/libvirtd /etc/sysconfig/libvirtd; do
            if [[ -e $args_file ]] && grep -Eq '^[[:space:]]*LIBVIRTD_ARGS=.*--listen' "$args_file"; then
                die "$args_file passes --listen, which libvirtd refuses under socket activation; remove it and run again"
            fi
        done
    fi
    mapfile -t steps < <(socket_steps)
    for step in "${steps[@]}"; do
        note "systemctl $step"
        # shellcheck disable=SC2086 # each step is a verb and a unit
        systemctl $step
    done
}

if ((!restart)); then
    print_manual_steps
elif systemd_running; then
    bring_up_with_systemd
else
    echo
    if [[ $mode == modular ]]; then
        echo "This host does not run systemd, so nothing was restarted. With virtqemud running,"
        echo "stop a running virtproxyd (if any), then start it with the TLS listener:"
    else
        echo "This host does not run systemd, so nothing was restarted. Stop a running libvirtd"
        echo "(if any), then start it with the TLS listener:"
    fi
    echo "  $start_command"
fi

host_for_uri=${san_list[0]}
is_ip "$host_for_uri" && [[ $host_for_uri == *:* ]] && host_for_uri="[$host_for_uri]"
port_suffix=""
[[ -z $tls_port || $tls_port == "$DEFAULT_TLS_PORT" ]] || port_suffix=":$tls_port"
cat <<EOF

Client credentials (mode 600) are in $client_dir:
  cacert.pem clientcert.pem clientkey.pem
Check the listener from a machine that has them:
  virsh -c "qemu+tls://$host_for_uri$port_suffix/system?pkipath=$client_dir" version
Then give them to banlieue:
  kubectl -n banlieue-system create secret generic libvirt-creds \\
    --from-file=tls.crt="$client_cert" --from-file=tls.key="$client_key"
  kubectl -n banlieue-system create configmap libvirt-ca --from-file=ca.crt="$client_dir/cacert.pem"
EOF
