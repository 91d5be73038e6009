#!/usr/bin/env bash
# scripts/bootstrap-libvirt-tls.sh against real daemons, in both of libvirt's layouts:
#
# - monolithic: the script writes its PKI and libvirtd.conf under a temp root (--root), libvirtd
#   is started on exactly that libvirtd.conf, and virsh must reach it over TLS with the client
#   files the script left behind, while a client the same CA signed for another name is refused
#   (tls_allowed_dn_list). Done once with certtool and once with openssl making the
#   certificates.
# - modular: virtqemud runs first, the script must see it and write virtproxyd.conf instead;
#   virtproxyd is started on that file, and virsh over TLS to virtproxyd defines and lists a
#   domain that virtqemud holds (seen on virtqemud's own socket too).
#
# Before that, without a daemon: the refusals (a git work tree, a --hostname that is not a
# name, a --client-dir outside the sudo user's home), the CA directory of its own, and the
# choice of daemons from programs and configuration files. After it, the systemd path, with a
# stand-in systemctl that answers from a table and records what it is told to do, in a mount
# namespace whose /run says systemd runs and whose /etc is a copy-on-write layer: which units
# the script reads, which steps it runs in each layout, and what it refuses.
#
# The daemons run in a private mount namespace whose /etc/libvirt, /var/lib/libvirt, /run and
# /var/log are directories of the temp root, as crates/banlieue-testenv does it; they listen
# on 127.0.0.1 only and are stopped by their PIDs. libvirtd is the system's /usr/sbin/libvirtd;
# virtqemud and virtproxyd, which Debian does not ship, are built by scripts/setup.d/32-libvirt-modular.sh.
#
# A missing daemon fails the test, unless BANLIEUE_ALLOW_MISSING_PEERS=1 (a loud skip).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
# shellcheck source=scripts/lib/env.sh
source scripts/lib/env.sh

script="$repo/scripts/bootstrap-libvirt-tls.sh"
libvirtd_bin=/usr/sbin/libvirtd
modular_dir=$BANLIEUE_CACHE/libvirt-modular/sbin
virtqemud_bin=$modular_dir/virtqemud
virtproxyd_bin=$modular_dir/virtproxyd
banlieue_bin="${CARGO_TARGET_DIR:-$repo/target}/debug/banlieue"
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
# Without the modular daemons only their run is left out, and only when allowed.
modular_missing=""
if [[ ! -x $virtqemud_bin || ! -x $virtproxyd_bin ]]; then
    modular_missing="virtqemud and virtproxyd are not built in $modular_dir"
    [[ ${BANLIEUE_ALLOW_MISSING_PEERS:-} == 1 ]] ||
        fail "$modular_missing: run scripts/setup libvirt-modular (scripts/setup.d/32-libvirt-modular.sh), or set BANLIEUE_ALLOW_MISSING_PEERS=1 to skip"
fi
((EUID == 0)) || fail "this test runs the system libvirtd in a private mount namespace and needs root"

temps=()
repo_root=""
root=""
# Every daemon started and not yet stopped, by PID.
daemon_pids=()
cleanup() {
    local pid t
    for pid in "${daemon_pids[@]}"; do stop_daemon "$pid" || true; done
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

# start_daemon NAME PROGRAM INSTANCE ARG...: PROGRAM ARG..., with INSTANCE/etc/libvirt as its
# /etc/libvirt (qemu.conf and the rest come from there too) and INSTANCE's lib, run and log as
# the system's; its output goes to INSTANCE/NAME.stderr. Sets started_pid. Daemons started on
# one INSTANCE see the same /run, so virtproxyd finds virtqemud's socket.
start_daemon() {
    local name=$1 program=$2 instance=$3
    shift 3
    # shellcheck disable=SC2016 # expanded by the inner shell
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" \
        LIBVIRT_DRIVER_DIR="$instance/drivers" \
        setpriv --pdeathsig KILL -- \
        unshare --mount --propagation private -- \
        sh -c 'set -eu
            mount --bind "$1/etc/libvirt" /etc/libvirt
            mount --bind "$1/lib" /var/lib/libvirt
            mount --bind "$1/run" /run
            mount --bind "$1/log" /var/log
            shift
            exec "$@"' \
        banlieue-bootstrap-tls-test "$instance" "$program" "$@" \
        </dev/null >"$instance/$name.stderr" 2>&1 &
    started_pid=$!
    daemon_pids+=("$started_pid")
    daemon_instance=$instance
}

# stop_daemon PID: SIGTERM, then SIGKILL after stop_timeout; PID leaves daemon_pids.
stop_daemon() {
    local pid=$1 deadline=$((SECONDS + stop_timeout)) p kept=()
    for p in "${daemon_pids[@]}"; do [[ $p == "$pid" ]] || kept+=("$p"); done
    daemon_pids=("${kept[@]}")
    kill -TERM "$pid" 2>/dev/null || return 0
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "daemon $pid did not exit within ${stop_timeout}s of SIGTERM: SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

daemon_diagnostics() {
    local f
    for f in "$daemon_instance"/*.stderr; do
        [[ -e $f ]] || continue
        echo "--- $(basename "$f" .stderr) stderr (tail) ---" >&2
        tail -n 40 "$f" >&2 || true
    done
}

# virsh_until_ready URI PID...: virsh version, retried until it answers or one of the daemons
# dies. The first start on a machine probes QEMU's capabilities, which takes seconds.
virsh_until_ready() {
    local uri=$1 deadline=$((SECONDS + ready_timeout)) out pid
    shift
    while :; do
        if out=$(timeout 60 virsh -c "$uri" version 2>&1); then
            printf '%s\n' "$out"
            return 0
        fi
        for pid in "$@"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                daemon_diagnostics
                fail "daemon $pid exited before answering; virsh said: $out"
            fi
        done
        if ((SECONDS >= deadline)); then
            daemon_diagnostics
            fail "no answer over TLS within ${ready_timeout}s; virsh said: $out"
        fi
        sleep 0.2
    done
}

# expect_line FILE TEXT WHAT: FILE has a line containing TEXT, or the test fails saying WHAT.
expect_line() {
    grep -qF -- "$2" "$1" || fail "$3; output was: $(cat "$1")"
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

# --- which daemons: from the programs installed, then the configuration files -------------
# Stand-ins for the programs (they are never run) in DIR/usr/sbin, where --root makes the
# script look; the keys are made once and kept by the later runs.
new_temp det
mkdir -p "$det/usr/sbin" "$det/run"
"$script" --root "$det" --san 127.0.0.1 >"$det/empty.out"
expect_line "$det/empty.out" "daemons: monolithic (libvirtd), assumed: no libvirt daemon is running, installed or configured here (pass --daemons modular for virtproxyd)" \
    "an empty host is not taken for libvirtd"
[[ -e $det/etc/libvirt/libvirtd.conf && ! -e $det/etc/libvirt/virtproxyd.conf ]] ||
    fail "an empty host did not get libvirtd.conf"
for program in virtqemud virtproxyd; do
    printf '#!/bin/sh\nexit 1\n' >"$det/usr/sbin/$program"
    chmod 755 "$det/usr/sbin/$program"
done
# A pid file naming a live process that is not virtqemud (this shell) is no running daemon.
echo $$ >"$det/run/virtqemud.pid"
"$script" --root "$det" --san 127.0.0.1 >"$det/programs.out"
expect_line "$det/programs.out" "daemons: modular (virtproxyd + virtqemud), since $det/usr/sbin/virtproxyd is installed; TLS settings go in $det/etc/libvirt/virtproxyd.conf" \
    "installed modular daemons are not taken for the modular layout"
grep -qx "tls_allowed_dn_list = \[ \"O=banlieue,CN=banlieue\" \]" "$det/etc/libvirt/virtproxyd.conf" ||
    fail "virtproxyd.conf does not allow the client's DN"
expect_line "$det/programs.out" "systemctl restart virtproxyd-tls.socket" "the modular steps do not name virtproxyd-tls.socket"
expect_line "$det/programs.out" "virtproxyd -f $det/etc/libvirt/virtproxyd.conf -d" "the modular start command is not virtproxyd -f"
pass "installed virtqemud/virtproxyd choose virtproxyd.conf; a pid file of another process is not a running daemon"
# Both kinds installed and nothing running: the script does not guess, and writes nothing.
printf '#!/bin/sh\nexit 1\n' >"$det/usr/sbin/libvirtd"
chmod 755 "$det/usr/sbin/libvirtd"
before=$(cat "$det/etc/libvirt/libvirtd.conf" "$det/etc/libvirt/virtproxyd.conf")
if "$script" --root "$det" --san 127.0.0.1 --san 127.0.0.9 >"$det/both.out" 2>&1; then
    fail "the script chose a layout with libvirtd and virtproxyd both installed"
fi
expect_line "$det/both.out" "cannot tell which libvirt daemons this host runs: $det/usr/sbin/libvirtd is installed, and $det/usr/sbin/virtproxyd is installed; pass --daemons monolithic (libvirtd) or --daemons modular (virtproxyd + virtqemud)" \
    "the refusal of an ambiguous host does not say why"
[[ $(cat "$det/etc/libvirt/libvirtd.conf" "$det/etc/libvirt/virtproxyd.conf") == "$before" ]] || fail "the script wrote before refusing an ambiguous host"
openssl x509 -in "$det/etc/pki/libvirt/servercert.pem" -noout -ext subjectAltName | grep -q 127.0.0.9 &&
    fail "the script reissued the server certificate before refusing an ambiguous host"
"$script" --root "$det" --san 127.0.0.1 --daemons monolithic >"$det/explicit.out"
expect_line "$det/explicit.out" "daemons: monolithic (libvirtd), as --daemons says; TLS settings go in $det/etc/libvirt/libvirtd.conf" "--daemons monolithic is not obeyed"
# libvirtd.conf was made by the first run, from nothing: the same settings leave it alone.
expect_line "$det/explicit.out" "$det/etc/libvirt/libvirtd.conf already has the TLS listener settings" \
    "a configuration file the script made from nothing was rewritten by a re-run"
pass "with libvirtd and virtproxyd both installed the script asks for --daemons, and obeys it"
# No programs: both configuration files exist now (Fedora installs both), so again no guess.
rm -f "$det"/usr/sbin/*
if "$script" --root "$det" --san 127.0.0.1 >"$det/confs.out" 2>&1; then
    fail "the script chose a layout with libvirtd.conf and virtproxyd.conf both present"
fi
expect_line "$det/confs.out" "$det/etc/libvirt/libvirtd.conf exists, and $det/etc/libvirt/virtproxyd.conf exists" \
    "the refusal of two configuration files does not name them"
rm "$det/etc/libvirt/libvirtd.conf"
"$script" --root "$det" --san 127.0.0.1 >"$det/conf.out"
expect_line "$det/conf.out" "daemons: modular (virtproxyd + virtqemud), since $det/etc/libvirt/virtproxyd.conf exists" \
    "virtproxyd.conf alone does not choose the modular layout"
if "$script" --root "$det" --daemons both >"$det/bad.out" 2>&1; then fail "--daemons both was accepted"; fi
expect_line "$det/bad.out" "--daemons must be monolithic or modular, got 'both'" "--daemons both is refused without a reason"
pass "without programs the configuration files decide; --daemons takes monolithic or modular only"

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
    # No daemon runs and none is installed in the root: the configuration file decides.
    expect_line "$root/bootstrap.out" "daemons: monolithic (libvirtd), since $root/etc/libvirt/libvirtd.conf exists; TLS settings go in $root/etc/libvirt/libvirtd.conf" \
        "$tool: the script did not say it chose libvirtd because of libvirtd.conf"
    [[ ! -e $root/etc/libvirt/virtproxyd.conf ]] || fail "$tool: the script wrote virtproxyd.conf on a monolithic host"

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

    # The root is the daemon's instance too: its /run is $root/run, where the script looks for
    # a running daemon's pid file.
    lay_out_instance "$root"
    start_daemon libvirtd "$libvirtd_bin" "$root" --listen -f "$conf"
    libvirtd_pid=$started_pid
    uri="qemu+tls://127.0.0.1:$port/system?pkipath=$client"
    version=$(virsh_until_ready "$uri" "$libvirtd_pid")
    grep -q "Running hypervisor: QEMU" <<<"$version" || fail "unexpected virsh version output: $version"
    pass "$tool: virsh version over TLS: $(grep 'Running hypervisor' <<<"$version" | sed 's/^ *//')"

    # banlieue's own client reads the same pkipath directory virsh does.
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
    kill -0 "$libvirtd_pid" 2>/dev/null || fail "$tool: libvirtd died refusing a client"
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
    kill -0 "$libvirtd_pid" 2>/dev/null || fail "$tool: libvirtd died refusing a client"
    virsh -c "$uri" version >/dev/null 2>&1 || fail "$tool: the issued client no longer gets in"
    pass "$tool: a client the same CA signed for another DN is refused ($(grep -m1 -o 'error: .*' <<<"$refused" | tail -1))"

    # A running libvirtd outweighs the configuration files; a re-run while it runs changes
    # nothing.
    "$script" "${args[@]}" >"$root/bootstrap-running.out"
    expect_line "$root/bootstrap-running.out" "daemons: monolithic (libvirtd), since libvirtd is running (pid $libvirtd_pid, $root/run/libvirtd.pid)" \
        "$tool: the script did not see the running libvirtd"
    expect_line "$root/bootstrap-running.out" "$conf already has the TLS listener settings" "$tool: a re-run rewrote libvirtd.conf"
    pass "$tool: a re-run sees the running libvirtd (pid file $root/run/libvirtd.pid) and changes nothing"

    stop_daemon "$libvirtd_pid"
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

# --- modular daemons: virtproxyd listens for TLS and forwards to virtqemud ------------------
# run_modular: the whole modular case; left out, loudly, when the daemons are not built and
# BANLIEUE_ALLOW_MISSING_PEERS=1.
run_modular() {
    # A host in the modular layout: virtqemud runs (started first, as on such a host), its
    # configuration and virtproxyd.conf exist beside the libvirtd.conf the package left.
    new_temp root
    cp -a /etc/libvirt "$root/etc-libvirt"
    mkdir -p "$root/etc"
    mv "$root/etc-libvirt" "$root/etc/libvirt"
    rm -f "$root"/etc/libvirt/qemu/networks/autostart/* "$root"/etc/libvirt/storage/autostart/*
    printf '\nstdio_handler = "file"\ncgroup_controllers = [ ]\n' >>"$root/etc/libvirt/qemu.conf"
    printf '# virtqemud: the defaults\n' >"$root/etc/libvirt/virtqemud.conf"
    printf 'listen_tls = 0\nmax_clients = 100\n' >"$root/etc/libvirt/virtproxyd.conf"
    libvirtd_conf_before=$(cat "$root/etc/libvirt/libvirtd.conf")
    proxy_conf_before=$(cat "$root/etc/libvirt/virtproxyd.conf")
    lay_out_instance "$root"
    start_daemon virtqemud "$virtqemud_bin" "$root"
    virtqemud_pid=$started_pid
    deadline=$((SECONDS + ready_timeout))
    until [[ -S $root/run/libvirt/virtqemud-sock && -s $root/run/virtqemud.pid ]]; do
        if ! kill -0 "$virtqemud_pid" 2>/dev/null; then daemon_diagnostics; fail "modular: virtqemud exited on start"; fi
        if ((SECONDS >= deadline)); then daemon_diagnostics; fail "modular: virtqemud made no socket within ${ready_timeout}s"; fi
        sleep 0.1
    done

    port=$(free_port)
    args=(--root "$root" --san 127.0.0.1 --listen-addr 127.0.0.1 --tls-port "$port")
    "$script" "${args[@]}" >"$root/bootstrap.out"
    conf="$root/etc/libvirt/virtproxyd.conf"
    client="$root/home/.config/banlieue/libvirt"
    expect_line "$root/bootstrap.out" "daemons: modular (virtproxyd + virtqemud), since virtqemud is running (pid $virtqemud_pid, $root/run/virtqemud.pid); TLS settings go in $conf" \
        "modular: the script did not see the running virtqemud"
    grep -qx 'listen_tls = 1' "$conf" || fail "modular: $conf does not set listen_tls = 1"
    grep -qx 'auth_tls = "none"' "$conf" || fail "modular: $conf does not set auth_tls"
    grep -qx "tls_port = \"$port\"" "$conf" || fail "modular: $conf does not set tls_port"
    grep -qx "key_file = \"$root/etc/pki/libvirt/private/serverkey.pem\"" "$conf" || fail "modular: $conf does not name the server key"
    grep -qx 'tls_allowed_dn_list = \[ "O=banlieue,CN=banlieue" \]' "$conf" || fail "modular: $conf does not allow the client's DN"
    grep -qx 'max_clients = 100' "$conf" || fail "modular: $conf lost a setting it did not manage"
    grep -qx '#(banlieue) listen_tls = 0' "$conf" || fail "modular: $conf still has the old listen_tls"
    backups=("$conf".bak.*)
    if ((${#backups[@]} != 1)) || [[ $(cat "${backups[0]}") != "$proxy_conf_before" ]]; then
        fail "modular: the previous virtproxyd.conf was not kept"
    fi
    [[ $(cat "$root/etc/libvirt/libvirtd.conf") == "$libvirtd_conf_before" ]] || fail "modular: the script changed libvirtd.conf"
    # The steps it prints for systemd, and the command without it.
    steps=$(sed -n 's/^    systemctl //p' "$root/bootstrap.out")
    want=$(printf '%s\n' daemon-reload "stop virtproxyd.service" "enable virtqemud.socket" \
        "start virtqemud.socket" "start virtproxyd.socket" "enable virtproxyd-tls.socket" \
        "restart virtproxyd-tls.socket" "start virtproxyd.service")
    [[ $steps == "$want" ]] || fail "modular: the systemd steps printed are: $steps"
    expect_line "$root/bootstrap.out" "virtproxyd -f $conf -d" "modular: the start command without systemd is not virtproxyd -f"
    [[ $(cat "$root/etc/systemd/system/virtproxyd-tls.socket.d/banlieue.conf") == *"ListenStream=127.0.0.1:$port"* ]] ||
        fail "modular: the socket drop-in is not for virtproxyd-tls.socket"
    [[ ! -e $root/etc/systemd/system/libvirtd-tls.socket.d ]] || fail "modular: a drop-in was written for libvirtd-tls.socket"
    pass "modular: virtproxyd.conf written (libvirtd.conf untouched), virtproxyd's systemd steps and start command printed"

    # virtproxyd started as the script says, without -d so that its PID is known.
    start_daemon virtproxyd "$virtproxyd_bin" "$root" -f "$conf"
    virtproxyd_pid=$started_pid
    uri="qemu+tls://127.0.0.1:$port/system?pkipath=$client"
    version=$(virsh_until_ready "$uri" "$virtproxyd_pid" "$virtqemud_pid")
    grep -q "Running hypervisor: QEMU" <<<"$version" || fail "modular: unexpected virsh version output: $version"
    pass "modular: virsh version over TLS to virtproxyd: $(grep 'Running hypervisor' <<<"$version" | sed 's/^ *//')"

    # A domain defined through virtproxyd is virtqemud's: it lists over TLS, virtqemud keeps its
    # XML in /etc/libvirt/qemu, and virtqemud's own socket lists it too.
    domain=banlieue-bootstrap-tls-modular
    printf '%s\n' "<domain type='qemu'>" "  <name>$domain</name>" "  <memory unit='MiB'>64</memory>" \
        "  <os><type arch='x86_64'>hvm</type></os>" "</domain>" >"$root/domain.xml"
    out=$(timeout 60 virsh -c "$uri" define "$root/domain.xml" 2>&1) || fail "modular: virsh define over TLS failed: $out"
    listed=$(timeout 60 virsh -c "$uri" list --all --name 2>&1) || fail "modular: virsh list over TLS failed: $listed"
    grep -qx "$domain" <<<"$listed" || fail "modular: the defined domain is not listed over TLS: $listed"
    [[ -e $root/etc/libvirt/qemu/$domain.xml ]] || fail "modular: virtqemud did not store the domain's XML"
    direct=$(timeout 60 virsh -c "qemu:///system?socket=$root/run/libvirt/virtqemud-sock" list --all --name 2>&1) ||
        fail "modular: virsh on virtqemud's socket failed: $direct"
    grep -qx "$domain" <<<"$direct" || fail "modular: virtqemud does not hold the domain defined through virtproxyd: $direct"
    [[ -x $banlieue_bin ]] || (cd "$repo" && build_banlieue)
    ours=$("$banlieue_bin" libvirt version -c "$uri") || fail "modular: banlieue libvirt version failed: $ours"
    pass "modular: a domain defined over TLS through virtproxyd is listed, and held by virtqemud; banlieue libvirt version: $(head -1 <<<"$ours")"

    # tls_allowed_dn_list in virtproxyd.conf is in force: another DN from the same CA is refused.
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
        fail "modular: virtproxyd accepted a client the CA signed for another name"
    fi
    kill -0 "$virtproxyd_pid" 2>/dev/null || fail "modular: virtproxyd died refusing a client"
    pass "modular: a client the same CA signed for another DN is refused by virtproxyd ($(grep -m1 -o 'error: .*' <<<"$refused" | tail -1))"

    # A re-run sees virtproxyd running, and changes nothing.
    "$script" "${args[@]}" >"$root/bootstrap-again.out"
    expect_line "$root/bootstrap-again.out" "daemons: modular (virtproxyd + virtqemud), since virtproxyd is running (pid $virtproxyd_pid, $root/run/virtproxyd.pid)" \
        "modular: a re-run did not see the running virtproxyd"
    expect_line "$root/bootstrap-again.out" "$conf already has the TLS listener settings" "modular: a re-run rewrote virtproxyd.conf"
    backups=("$conf".bak.*)
    ((${#backups[@]} == 1)) || fail "modular: a re-run made another backup of virtproxyd.conf"
    timeout 60 virsh -c "$uri" undefine "$domain" >/dev/null || fail "modular: virsh undefine over TLS failed"
    stop_daemon "$virtproxyd_pid"
    stop_daemon "$virtqemud_pid"
    pass "modular: a re-run sees virtproxyd running and changes nothing; virtproxyd and virtqemud stopped"
}
if [[ -n $modular_missing ]]; then
    echo
    echo "!!!!! SKIPPED: $modular_missing; the modular layout not tested against daemons (BANLIEUE_ALLOW_MISSING_PEERS=1) !!!!!"
    echo
else
    run_modular
fi

# --- with systemd: which units are read, which steps are run --------------------------------
# This machine has no systemd, so the script meets a stand-in: a systemctl that answers
# is-active, is-enabled and cat from a table (UNIT ACTIVE-STATE ENABLED-STATE, one installed
# unit a line) and records every other command, in a mount namespace where /run/systemd/system
# exists and /etc is a copy-on-write layer over the real one, whose changes land in $sd/upper.
# It runs as on a real host (no --root); the CA, keys and configuration written by one case
# stay for the next, as they would on one host.
new_temp sd
mkdir -p "$sd/bin" "$sd/upper" "$sd/work" "$sd/home"
cat >"$sd/bin/systemctl" <<'EOF'
#!/bin/sh
# systemctl stand-in: answers from $FAKE_UNITS, records the rest in $FAKE_LOG.
verb=$1 unit=${2:-}
line=$(awk -v u="$unit" '$1 == u' "$FAKE_UNITS")
case $verb in
is-active)
    state=$(printf '%s\n' "$line" | awk '{print $2}')
    echo "${state:-inactive}"
    [ "$state" = active ]
    ;;
is-enabled)
    if [ -z "$line" ]; then
        echo "Failed to get unit file state for $unit: No such file or directory" >&2
        exit 1
    fi
    state=$(printf '%s\n' "$line" | awk '{print $3}')
    echo "$state"
    [ "$state" = enabled ]
    ;;
cat)
    [ -n "$line" ] || { echo "No files found for $unit." >&2; exit 1; }
    echo "# /usr/lib/systemd/system/$unit"
    ;;
*) echo "$*" >>"$FAKE_LOG" ;;
esac
EOF
chmod 755 "$sd/bin/systemctl"

# under_systemd NAME ARG...: the script with ARG... on this machine as a systemd host whose
# units are $sd/NAME.units; its output in $sd/NAME.out, the commands systemctl was given in
# $sd/NAME.log. Fails as the script fails.
under_systemd() {
    local name=$1
    shift
    : >"$sd/$name.log"
    # shellcheck disable=SC2016 # expanded by the inner shell
    env -i PATH="$sd/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME="$sd/home" \
        FAKE_UNITS="$sd/$name.units" FAKE_LOG="$sd/$name.log" \
        unshare --mount --propagation private -- \
        sh -c 'set -eu
            mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc
            mount -t tmpfs tmpfs /run
            mkdir -p /run/systemd/system
            shift
            exec "$@"' \
        banlieue-bootstrap-tls-systemd "$sd" "$script" --no-host-names --san 127.0.0.1 "$@" \
        </dev/null >"$sd/$name.out" 2>&1
}

# A RHEL 9 host at rest: the modular sockets listen, libvirtd is installed but off.
cat >"$sd/modular.units" <<'EOF'
libvirtd.service inactive disabled
libvirtd.socket inactive disabled
libvirtd-tls.socket inactive disabled
virtqemud.service inactive enabled
virtqemud.socket active enabled
virtproxyd.service inactive enabled
virtproxyd.socket active enabled
virtproxyd-tls.socket inactive disabled
EOF
under_systemd modular --listen-addr 127.0.0.1 --tls-port 16600 ||
    fail "systemd, modular: the script failed: $(cat "$sd/modular.out")"
expect_line "$sd/modular.out" "daemons: modular (virtproxyd + virtqemud), since virtproxyd.socket is active; TLS settings go in /etc/libvirt/virtproxyd.conf" \
    "systemd, modular: the script did not choose virtproxyd from the active sockets"
want="daemon-reload
stop virtproxyd.service
enable virtqemud.socket
start virtqemud.socket
start virtproxyd.socket
enable virtproxyd-tls.socket
restart virtproxyd-tls.socket
start virtproxyd.service"
[[ $(cat "$sd/modular.log") == "$want" ]] || fail "systemd, modular: systemctl was told: $(cat "$sd/modular.log")"
grep -qx 'tls_allowed_dn_list = \[ "O=banlieue,CN=banlieue" \]' "$sd/upper/libvirt/virtproxyd.conf" ||
    fail "systemd, modular: /etc/libvirt/virtproxyd.conf was not written"
grep -qx 'key_file = "/etc/pki/libvirt/private/serverkey.pem"' "$sd/upper/libvirt/virtproxyd.conf" ||
    fail "systemd, modular: virtproxyd.conf does not name /etc/pki/libvirt/private/serverkey.pem"
[[ -e $sd/upper/pki/libvirt/servercert.pem && -e $sd/upper/pki/banlieue-libvirt-ca/cacert.pem ]] ||
    fail "systemd, modular: the server certificate and CA are not under /etc/pki"
[[ ! -e $sd/upper/libvirt/libvirtd.conf ]] || fail "systemd, modular: libvirtd.conf was changed"
grep -qx 'ListenStream=127.0.0.1:16600' "$sd/upper/systemd/system/virtproxyd-tls.socket.d/banlieue.conf" ||
    fail "systemd, modular: no drop-in for virtproxyd-tls.socket"
pass "systemd, modular: chosen from virtproxyd.socket; daemon-reload, virtproxyd stopped, virtqemud.socket, virtproxyd.socket, virtproxyd-tls.socket enabled and restarted, virtproxyd started"

# The same again: nothing to reload, the same steps.
under_systemd modular --listen-addr 127.0.0.1 --tls-port 16600 ||
    fail "systemd, modular again: the script failed: $(cat "$sd/modular.out")"
expect_line "$sd/modular.out" "/etc/libvirt/virtproxyd.conf already has the TLS listener settings" "systemd, modular again: virtproxyd.conf was rewritten"
[[ $(cat "$sd/modular.log") == "${want#daemon-reload$'\n'}" ]] || fail "systemd, modular again: systemctl was told: $(cat "$sd/modular.log")"
pass "systemd, modular: a re-run rewrites nothing and skips daemon-reload"

# Nothing running, only enabled units decide.
sed 's/ active / inactive /' "$sd/modular.units" >"$sd/enabled.units"
under_systemd enabled --listen-addr 127.0.0.1 --tls-port 16600 ||
    fail "systemd, enabled: the script failed: $(cat "$sd/enabled.out")"
expect_line "$sd/enabled.out" "daemons: modular (virtproxyd + virtqemud), since virtproxyd.socket is enabled" \
    "systemd: enabled modular sockets did not choose virtproxyd"
pass "systemd: with nothing active, the enabled units decide"

# A Debian host: libvirtd's socket listens, no modular units at all.
cat >"$sd/monolithic.units" <<'EOF'
libvirtd.service inactive enabled
libvirtd.socket active enabled
libvirtd-tls.socket inactive disabled
EOF
under_systemd monolithic || fail "systemd, monolithic: the script failed: $(cat "$sd/monolithic.out")"
expect_line "$sd/monolithic.out" "daemons: monolithic (libvirtd), since libvirtd.socket is active; TLS settings go in /etc/libvirt/libvirtd.conf" \
    "systemd, monolithic: the script did not choose libvirtd from its active socket"
want="stop libvirtd.service
start libvirtd.socket
enable libvirtd-tls.socket
restart libvirtd-tls.socket
start libvirtd.service"
[[ $(cat "$sd/monolithic.log") == "$want" ]] || fail "systemd, monolithic: systemctl was told: $(cat "$sd/monolithic.log")"
grep -qx 'tls_allowed_dn_list = \[ "O=banlieue,CN=banlieue" \]' "$sd/upper/libvirt/libvirtd.conf" ||
    fail "systemd, monolithic: /etc/libvirt/libvirtd.conf was not written"
pass "systemd, monolithic: chosen from libvirtd.socket; libvirtd's steps, unchanged"

# Both layouts active: no guess, and nothing run.
cat "$sd/modular.units" >"$sd/both.units"
sed -i 's/^libvirtd.service inactive disabled$/libvirtd.service active enabled/' "$sd/both.units"
if under_systemd both; then fail "systemd: the script chose a layout with libvirtd.service and virtproxyd.socket both active"; fi
expect_line "$sd/both.out" "cannot tell which libvirt daemons this host runs: libvirtd.service is active, and virtproxyd.socket is active" \
    "systemd: the refusal of two active layouts does not name the units"
[[ ! -s $sd/both.log ]] || fail "systemd: systemctl was told to act on an ambiguous host: $(cat "$sd/both.log")"

# The refusals of the modular path: no virtproxyd, a masked socket, --listen in its arguments.
grep -v '^virtproxyd' "$sd/modular.units" >"$sd/noproxy.units"
echo "virtqemud.socket active enabled" >>"$sd/noproxy.units"
if under_systemd noproxy --daemons modular; then fail "systemd: the script went on without virtproxyd.service"; fi
expect_line "$sd/noproxy.out" "virtproxyd.service is not installed" "systemd: a missing virtproxyd.service is not named"
sed 's/^virtproxyd-tls.socket inactive disabled$/virtproxyd-tls.socket inactive masked/' "$sd/modular.units" >"$sd/masked.units"
if under_systemd masked; then fail "systemd: the script went on with virtproxyd-tls.socket masked"; fi
expect_line "$sd/masked.out" "virtproxyd-tls.socket is masked" "systemd: a masked virtproxyd-tls.socket is not named"
for case in noproxy masked; do
    [[ ! -s $sd/$case.log ]] || fail "systemd, $case: systemctl was told: $(cat "$sd/$case.log")"
done
pass "systemd: refuses two active layouts, a missing virtproxyd.service and a masked virtproxyd-tls.socket before running any step"
