#!/usr/bin/env bash
# scripts/bootstrap-libvirt-tls.sh against a real libvirtd: the script writes its PKI and
# libvirtd.conf under a temp root (--root), a daemon is started on exactly that libvirtd.conf,
# and virsh must reach it over TLS with the client files the script left behind, while a client
# the same CA signed for another name is refused (tls_allowed_dn_list). Done once with certtool
# and once with openssl making the certificates. Before that, without a daemon: the refusals
# (a git work tree, a --hostname that is not a name, a --client-dir outside the sudo user's
# home) and the CA directory of its own.
#
# The daemon is the system's /usr/sbin/libvirtd in a private mount namespace whose
# /etc/libvirt, /var/lib/libvirt, /run and /var/log are directories of the temp root, as
# crates/banlieue-testenv does it; it listens on 127.0.0.1 only and is stopped by its PID.
#
# A missing libvirtd fails the test, unless BANLIEUE_ALLOW_MISSING_PEERS=1 (a loud skip).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
# shellcheck source=scripts/lib/env.sh
source scripts/lib/env.sh

script="$repo/scripts/bootstrap-libvirt-tls.sh"
libvirtd_bin=/usr/sbin/libvirtd
driver_dir=/usr/lib/x86_64-linux-gnu/libvirt/connection-driver
# As in the testenv: nodedev is left out (its udev thread can hang the daemon's shutdown).
drivers=(qemu storage secret network nwfilter)
ready_timeout=120
stop_timeout=15

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

pass() {
    echo "ok: $*"
}

missing=""
[[ -x $libvirtd_bin ]] || missing="$libvirtd_bin is not installed"
[[ -n $missing ]] || command -v virsh >/dev/null || missing="virsh is not installed"
if [[ -n $missing ]]; then
    if [[ ${BANLIEUE_ALLOW_MISSING_PEERS:-} == 1 ]]; then
        echo
        echo "!!!!! SKIPPED: $missing; scripts/bootstrap-libvirt-tls.sh not tested against a daemon (BANLIEUE_ALLOW_MISSING_PEERS=1) !!!!!"
        echo
        exit 0
    fi
    fail "$missing: run scripts/setup (or set BANLIEUE_ALLOW_MISSING_PEERS=1 to skip)"
fi
((EUID == 0)) || fail "this test runs the system libvirtd in a private mount namespace and needs root"

temps=()
repo_root=""
root=""
daemon_pid=""
cleanup() {
    stop_daemon || true
    local t
    for t in "${temps[@]}"; do rm -rf "$t"; done
}
trap cleanup EXIT

# new_temp VAR: a fresh temp dir in VAR, removed on exit.
new_temp() {
    local t
    t=$(mktemp -d "${TMPDIR:-/tmp}/banlieue-bootstrap-tls.XXXXXX")
    temps+=("$t")
    printf -v "$1" '%s' "$t"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

mode_of() {
    stat -c %a "$1"
}

expect_mode() {
    local want=$1 path=$2
    [[ $(mode_of "$path") == "$want" ]] || fail "$path has mode $(mode_of "$path"), want $want"
}

# copy_dirs SRC DST: the directory skeleton of SRC with owners and modes, no files (the real
# /var/lib/libvirt may hold a host's images).
copy_dirs() {
    local src=$1 dst=$2 d
    [[ -d $src ]] || { mkdir -p "$dst"; return; }
    while IFS= read -r -d '' d; do
        mkdir -p "$dst/$d"
        chown --reference="$src/$d" "$dst/$d"
        chmod --reference="$src/$d" "$dst/$d"
    done < <(cd "$src" && find . -type d -print0)
}

# The directories the daemon sees in place of the system's, under INSTANCE.
lay_out_instance() {
    local instance=$1 driver
    chmod 711 "$instance"
    copy_dirs /var/lib/libvirt "$instance/lib"
    mkdir -p "$instance/log"
    chmod 755 "$instance/log"
    copy_dirs /var/log/libvirt "$instance/log/libvirt"
    mkdir -p "$instance/log/libvirt/qemu" "$instance/log/swtpm"
    mkdir -p "$instance/run/libvirt" "$instance/run/lock"
    chmod 755 "$instance/run" "$instance/run/libvirt"
    chmod 1777 "$instance/run/lock"
    ln -s /dev/shm "$instance/run/shm"
    mkdir -p "$instance/drivers"
    for driver in "${drivers[@]}"; do
        ln -s "$driver_dir/libvirt_driver_$driver.so" "$instance/drivers/"
    done
}

# start_daemon CONF_DIR INSTANCE: libvirtd --listen -f CONF_DIR/libvirtd.conf, with CONF_DIR
# as its /etc/libvirt (qemu.conf and the rest come from there too).
start_daemon() {
    local conf_dir=$1 instance=$2
    # shellcheck disable=SC2016 # expanded by the inner shell
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" \
        LIBVIRT_DRIVER_DIR="$instance/drivers" \
        setpriv --pdeathsig KILL -- \
        unshare --mount --propagation private -- \
        sh -c 'set -eu
            mount --bind "$1" /etc/libvirt
            mount --bind "$2/lib" /var/lib/libvirt
            mount --bind "$2/run" /run
            mount --bind "$2/log" /var/log
            exec "$3" --listen -f "$1/libvirtd.conf" -p /run/libvirt/libvirtd.pid' \
        banlieue-bootstrap-tls-test "$conf_dir" "$instance" "$libvirtd_bin" \
        </dev/null >"$instance/libvirtd.stderr" 2>&1 &
    daemon_pid=$!
    daemon_instance=$instance
}

stop_daemon() {
    [[ -n $daemon_pid ]] || return 0
    local pid=$daemon_pid deadline=$((SECONDS + stop_timeout))
    daemon_pid=""
    kill -TERM "$pid" 2>/dev/null || return 0
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "libvirtd $pid did not exit within ${stop_timeout}s of SIGTERM: SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

daemon_diagnostics() {
    echo "--- libvirtd stderr (tail) ---" >&2
    tail -n 40 "$daemon_instance/libvirtd.stderr" >&2 || true
}

# virsh_until_ready URI: virsh version, retried until it answers or the daemon dies. The
# first start on a machine probes QEMU's capabilities, which takes seconds.
virsh_until_ready() {
    local uri=$1 deadline=$((SECONDS + ready_timeout)) out
    while :; do
        if out=$(timeout 60 virsh -c "$uri" version 2>&1); then
            printf '%s\n' "$out"
            return 0
        fi
        if ! kill -0 "$daemon_pid" 2>/dev/null; then
            daemon_diagnostics
            fail "libvirtd exited before answering; virsh said: $out"
        fi
        if ((SECONDS >= deadline)); then
            daemon_diagnostics
            fail "libvirtd did not answer over TLS within ${ready_timeout}s; virsh said: $out"
        fi
        sleep 0.2
    done
}

fingerprint() {
    openssl x509 -in "$1" -noout -fingerprint -sha256
}

# --- --help names every option ------------------------------------------------------------
help=$("$script" --help)
for option in --san --hostname --no-host-names --client-cn --client-dir --ca-dir --listen-addr \
    --tls-port --days --tool --force --no-restart --root --help; do
    grep -q -- "$option" <<<"$help" || fail "--help does not mention $option"
done
pass "--help describes every option"

# --- the client's private key never lands in a git work tree ------------------------------
new_temp repo_root
mkdir "$repo_root/.git"
if "$script" --root "$repo_root" --san 127.0.0.1 >"$repo_root/refusal.out" 2>&1; then
    fail "the script wrote client credentials inside a git work tree"
fi
grep -q "git work tree" "$repo_root/refusal.out" || fail "refusal does not say why: $(cat "$repo_root/refusal.out")"
[[ ! -e $repo_root/etc ]] || fail "the script wrote files before refusing"
pass "refuses to write client credentials into a git work tree"

# --- --hostname is a DNS name or an IP address, nothing a template could read as more ------
# Each of these would otherwise reach a certtool template or libvirtd.conf between quotes.
for bad in 'kvm"' $'kvm"\nca' 'kvm;id' '$(id)' 'kvm 1' '-kvm' 'kvm..example' "$(printf 'a%.0s' {1..64})"; do
    new_temp bad_root
    if "$script" --root "$bad_root" --hostname "$bad" >"$bad_root/refusal.out" 2>&1; then
        fail "--hostname '$bad' was accepted"
    fi
    grep -q -- "--hostname must be a DNS name or an IP address" "$bad_root/refusal.out" ||
        fail "refusal of --hostname '$bad' does not say why: $(cat "$bad_root/refusal.out")"
    [[ ! -e $bad_root/etc ]] || fail "the script wrote files before refusing --hostname '$bad'"
done
for good in kvm-1.example.com kvm-1 192.0.2.7 2001:db8::7; do
    new_temp good_root
    "$script" --root "$good_root" --hostname "$good" --no-restart >/dev/null ||
        fail "--hostname '$good' was refused"
done
pass "--hostname takes DNS names and IP addresses, and refuses quotes, shell syntax and bad labels"

# --- under sudo, the client directory must be inside the invoking user's home ---------------
# The script hands that directory to $SUDO_USER; nobody is a user every system has.
new_temp sudo_root
new_temp elsewhere
if SUDO_USER=nobody "$script" --root "$sudo_root" --client-dir "$elsewhere/creds" \
    >"$sudo_root/refusal.out" 2>&1; then
    fail "the script handed a directory outside the sudo user's home to that user"
fi
grep -q "must go inside" "$sudo_root/refusal.out" || fail "refusal does not say why: $(cat "$sudo_root/refusal.out")"
[[ ! -e $sudo_root/etc && ! -e $elsewhere/creds ]] || fail "the script wrote files before refusing the client directory"
# A path that only looks inside the home (.. and a symbolic link out of it) is judged by where
# it really leads.
mkdir -p "$sudo_root/home"
ln -s "$elsewhere" "$sudo_root/home/link-out"
for sneaky in "$sudo_root/home/../outside" "$sudo_root/home/link-out/creds"; do
    if SUDO_USER=nobody "$script" --root "$sudo_root" --client-dir "$sneaky" >/dev/null 2>&1; then
        fail "--client-dir $sneaky escaped the sudo user's home"
    fi
done
[[ ! -e $sudo_root/etc ]] || fail "the script wrote files before refusing an escaping client directory"
# Inside the home: the files the script wrote go to the user, and nothing else in it does.
client="$sudo_root/home/.config/banlieue/libvirt"
mkdir -p "$client"
touch "$client/not-ours"
SUDO_USER=nobody "$script" --root "$sudo_root" --san 127.0.0.1 >/dev/null
for f in "$client" "$client/cacert.pem" "$client/clientcert.pem" "$client/clientkey.pem"; do
    [[ $(stat -c %U "$f") == nobody ]] || fail "$f is owned by $(stat -c %U "$f"), want nobody"
done
[[ $(stat -c %U "$client/not-ours") == root ]] || fail "a file the script did not write was handed to the sudo user"
pass "under sudo, --client-dir must be inside the user's home; only the script's own files are handed over"

# --- a CA directory of its own: an existing /etc/pki/CA is never used silently --------------
new_temp ca_root
mkdir -p "$ca_root/etc/pki/CA/private"
openssl req -x509 -newkey rsa:2048 -nodes -subj "/CN=someone else's CA" -days 1 \
    -keyout "$ca_root/etc/pki/CA/private/cakey.pem" -out "$ca_root/etc/pki/CA/cacert.pem" 2>/dev/null
foreign=$(fingerprint "$ca_root/etc/pki/CA/cacert.pem")
"$script" --root "$ca_root" --san 127.0.0.1 >"$ca_root/bootstrap.out"
grep -q "not using the CA in $ca_root/etc/pki/CA" "$ca_root/bootstrap.out" ||
    fail "the script did not say it leaves /etc/pki/CA alone: $(cat "$ca_root/bootstrap.out")"
[[ $(fingerprint "$ca_root/etc/pki/CA/cacert.pem") == "$foreign" ]] || fail "the script replaced /etc/pki/CA"
grep -qx "ca_file = \"$ca_root/etc/pki/banlieue-libvirt-ca/cacert.pem\"" "$ca_root/etc/libvirt/libvirtd.conf" ||
    fail "libvirtd.conf does not trust the script's own CA: $(grep ca_file "$ca_root/etc/libvirt/libvirtd.conf")"
if openssl verify -CAfile "$ca_root/etc/pki/CA/cacert.pem" "$ca_root/etc/pki/libvirt/servercert.pem" >/dev/null 2>&1; then
    fail "the server certificate was signed by the existing /etc/pki/CA"
fi
# Only when asked by name.
"$script" --root "$ca_root" --san 127.0.0.1 --ca-dir /etc/pki/CA >/dev/null
openssl verify -CAfile "$ca_root/etc/pki/CA/cacert.pem" "$ca_root/etc/pki/libvirt/servercert.pem" >/dev/null ||
    fail "--ca-dir /etc/pki/CA did not sign with that CA"
pass "keeps its own CA directory; uses /etc/pki/CA only with --ca-dir"

# --- against a real daemon, with each certificate tool ------------------------------------
for tool in certtool openssl; do
    command -v "$tool" >/dev/null || fail "$tool is not installed: run scripts/setup"
    new_temp root
    # A host that already has a libvirt configuration: the script must keep a backup of it
    # and leave its other settings in place. Autostarted networks and pools are dropped so the
    # daemon starts no dnsmasq or bridge on this machine.
    cp -a /etc/libvirt "$root/etc-libvirt"
    mkdir -p "$root/etc"
    mv "$root/etc-libvirt" "$root/etc/libvirt"
    rm -f "$root"/etc/libvirt/qemu/networks/autostart/* "$root"/etc/libvirt/storage/autostart/*
    printf 'listen_tls = 0\nmdns_adv = 0\n' >>"$root/etc/libvirt/libvirtd.conf"
    # No virtlogd runs in the namespace; QEMU writes its logs itself.
    printf '\nstdio_handler = "file"\ncgroup_controllers = [ ]\n' >>"$root/etc/libvirt/qemu.conf"
    original=$(cat "$root/etc/libvirt/libvirtd.conf")

    port=$(free_port)
    args=(--root "$root" --tool "$tool" --san 127.0.0.1 --listen-addr 127.0.0.1 --tls-port "$port")
    "$script" "${args[@]}" >"$root/bootstrap.out"

    conf="$root/etc/libvirt/libvirtd.conf"
    client="$root/home/.config/banlieue/libvirt"
    grep -qx 'listen_tls = 1' "$conf" || fail "$conf does not set listen_tls = 1"
    grep -qx 'auth_tls = "none"' "$conf" || fail "$conf does not set auth_tls = \"none\""
    grep -qx "tls_port = \"$port\"" "$conf" || fail "$conf does not set tls_port"
    grep -qx 'listen_addr = "127.0.0.1"' "$conf" || fail "$conf does not set listen_addr"
    grep -qx 'mdns_adv = 0' "$conf" || fail "$conf lost a setting it did not manage"
    grep -qx '#(banlieue) listen_tls = 0' "$conf" || fail "$conf still has the old listen_tls"
    grep -qx 'tls_allowed_dn_list = \[ "O=banlieue,CN=banlieue" \]' "$conf" ||
        fail "$conf does not allow exactly the issued client's DN: $(grep tls_allowed_dn_list "$conf")"
    backups=("$conf".bak.*)
    if ((${#backups[@]} != 1)) || [[ ! -e ${backups[0]} ]]; then
        fail "expected one backup of libvirtd.conf"
    fi
    [[ $(cat "${backups[0]}") == "$original" ]] || fail "the backup is not the previous libvirtd.conf"
    pass "$tool: libvirtd.conf written, previous one kept as $(basename "${backups[0]}")"

    expect_mode 700 "$client"
    for f in cacert.pem clientcert.pem clientkey.pem; do expect_mode 600 "$client/$f"; done
    expect_mode 600 "$root/etc/pki/libvirt/private/serverkey.pem"
    expect_mode 600 "$root/etc/pki/banlieue-libvirt-ca/private/cakey.pem"
    expect_mode 644 "$root/etc/pki/banlieue-libvirt-ca/cacert.pem"
    expect_mode 644 "$root/etc/pki/libvirt/servercert.pem"
    pass "$tool: client files 600 in a 700 directory, private keys 600"

    instance="$root/instance"
    mkdir "$instance"
    lay_out_instance "$instance"
    start_daemon "$root/etc/libvirt" "$instance"
    uri="qemu+tls://127.0.0.1:$port/system?pkipath=$client"
    version=$(virsh_until_ready "$uri")
    grep -q "Running hypervisor: QEMU" <<<"$version" || fail "unexpected virsh version output: $version"
    pass "$tool: virsh version over TLS: $(grep 'Running hypervisor' <<<"$version" | sed 's/^ *//')"

    # banlieue's own client reads the same pkipath directory virsh does.
    banlieue_bin="${CARGO_TARGET_DIR:-$repo/target}/debug/banlieue"
    [[ -x $banlieue_bin ]] || (cd "$repo" && build_banlieue)
    ours=$("$banlieue_bin" libvirt version -c "$uri") || fail "$tool: banlieue libvirt version failed: $ours"
    grep -qi "qemu" <<<"$ours" || fail "$tool: unexpected banlieue libvirt version output: $ours"
    pass "$tool: banlieue libvirt version over TLS: $(head -1 <<<"$ours")"

    # The TLS is mutual: a client certificate from another CA is turned away by the daemon.
    stranger="$root/stranger"
    "$script" --root "$stranger" --tool "$tool" --no-host-names --san 127.0.0.1 --client-cn stranger >/dev/null
    untrusted="$root/untrusted-client"
    mkdir -m 700 "$untrusted"
    cp "$client/cacert.pem" "$untrusted/"
    cp "$stranger/home/.config/banlieue/libvirt/"client*.pem "$untrusted/"
    if refused=$(timeout 60 virsh -c "qemu+tls://127.0.0.1:$port/system?pkipath=$untrusted" version 2>&1); then
        fail "$tool: the daemon accepted a client certificate from another CA"
    fi
    kill -0 "$daemon_pid" 2>/dev/null || fail "$tool: libvirtd died refusing a client"
    pass "$tool: a client certificate from another CA is refused ($(grep -m1 -o 'error: .*' <<<"$refused" | tail -1))"

    # Nor is one the same CA signed for another name: the CA's word alone is not enough.
    ca_dir="$root/etc/pki/banlieue-libvirt-ca"
    intruder="$root/intruder-client"
    mkdir -m 700 "$intruder"
    cp "$client/cacert.pem" "$intruder/"
    printf 'basicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature,keyEncipherment\nextendedKeyUsage = clientAuth\n' >"$root/intruder.ext"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$intruder/clientkey.pem" \
        -subj "/O=banlieue/CN=intruder" -out "$root/intruder.csr" 2>/dev/null
    openssl x509 -req -in "$root/intruder.csr" -CA "$ca_dir/cacert.pem" -CAkey "$ca_dir/private/cakey.pem" \
        -set_serial 7 -days 1 -extfile "$root/intruder.ext" -out "$intruder/clientcert.pem" 2>/dev/null
    if refused=$(timeout 60 virsh -c "qemu+tls://127.0.0.1:$port/system?pkipath=$intruder" version 2>&1); then
        fail "$tool: the daemon accepted a client the CA signed for another name"
    fi
    kill -0 "$daemon_pid" 2>/dev/null || fail "$tool: libvirtd died refusing a client"
    virsh -c "$uri" version >/dev/null 2>&1 || fail "$tool: the issued client no longer gets in"
    pass "$tool: a client the same CA signed for another DN is refused ($(grep -m1 -o 'error: .*' <<<"$refused" | tail -1))"

    stop_daemon
    pass "$tool: libvirtd stopped"

    # Re-running changes nothing: same CA, same certificates, no rewrite, no new backup.
    before=$(fingerprint "$root/etc/pki/banlieue-libvirt-ca/cacert.pem"; fingerprint "$root/etc/pki/libvirt/servercert.pem"; fingerprint "$client/clientcert.pem")
    "$script" "${args[@]}" >"$root/bootstrap-again.out"
    after=$(fingerprint "$root/etc/pki/banlieue-libvirt-ca/cacert.pem"; fingerprint "$root/etc/pki/libvirt/servercert.pem"; fingerprint "$client/clientcert.pem")
    [[ $before == "$after" ]] || fail "$tool: a re-run replaced the CA or a certificate"
    backups=("$conf".bak.*)
    ((${#backups[@]} == 1)) || fail "$tool: a re-run with the same options rewrote libvirtd.conf"
    pass "$tool: a re-run keeps the CA, the certificates and libvirtd.conf"

    # A new name reissues the server certificate under the same CA.
    "$script" "${args[@]}" --san 127.0.0.2 >"$root/bootstrap-san.out"
    [[ $(fingerprint "$root/etc/pki/banlieue-libvirt-ca/cacert.pem") == "$(head -1 <<<"$before")" ]] || fail "$tool: a new SAN replaced the CA"
    openssl x509 -in "$root/etc/pki/libvirt/servercert.pem" -noout -ext subjectAltName | grep -q "127.0.0.2" ||
        fail "$tool: the server certificate does not name the added SAN"
    pass "$tool: an added --san reissues the server certificate under the same CA"

    # --force makes a new CA.
    "$script" "${args[@]}" --force >"$root/bootstrap-force.out"
    [[ $(fingerprint "$root/etc/pki/banlieue-libvirt-ca/cacert.pem") != "$(head -1 <<<"$before")" ]] || fail "$tool: --force kept the CA"
    cmp -s "$ca_dir/cacert.pem" "$client/cacert.pem" || fail "$tool: the client's cacert.pem is not the new CA"
    pass "$tool: --force makes a new CA and hands it to the client"

    # Another --client-cn reissues the client certificate and allows that DN instead.
    "$script" "${args[@]}" --client-cn banlieue-2 >"$root/bootstrap-cn.out"
    [[ $(virt-pki-query-dn "$client/clientcert.pem") == "O=banlieue,CN=banlieue-2" ]] ||
        fail "$tool: a new --client-cn kept the old client certificate"
    grep -qx 'tls_allowed_dn_list = \[ "O=banlieue,CN=banlieue-2" \]' "$conf" ||
        fail "$tool: tls_allowed_dn_list does not follow --client-cn: $(grep tls_allowed_dn_list "$conf")"
    pass "$tool: a new --client-cn reissues the client certificate and allows its DN"
done
