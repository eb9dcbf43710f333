#!/usr/bin/env bash
# The Debian packages' life on a clean Debian 12 (a minbase root filesystem from mmdebstrap with
# only what the packages' Depends name, made once per build tree and kept as a tar): dpkg -i of
# the four packages, then in the chroot: the system user and groups, /etc/kprof/tls, the
# registered conffiles, kprof-run and every binary working from the installed layout; a
# reinstall keeps an admin's edit of a conffile; remove keeps the settings and the agent's
# spool; purge removes both and the empty directories, keeps an admin's TLS file and the user.
# Needs root, mmdebstrap and Debian's mirror the first time; exits 77 (skipped) without them.
# Usage: test_deb_lifecycle.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR
src=$1 bin=$2
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (chroot)"
for t in mmdebstrap cpack dpkg-deb chroot; do
    command -v "$t" >/dev/null || skip "$t not found (deploy/local/install-deps.sh installs it)"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cpack --config "$bin/CPackConfig.cmake" -G DEB -B "$tmp/out" >"$tmp/cpack.log" 2>&1 ||
    { cat "$tmp/cpack.log" >&2; exit 1; }
debs=("$tmp"/out/*.deb)
[ "${#debs[@]}" = 4 ] || { bad "cpack made ${#debs[@]} packages"; exit 1; }

# What the packages need from Debian, without versions: the base root filesystem's extras.
needs=$(for d in "${debs[@]}"; do dpkg-deb -f "$d" Depends; done | tr ',' '\n' |
    sed 's/([^)]*)//; s/ //g' | grep -v '^kprof' | grep . | sort -u | tr '\n' ',' | sed 's/,$//')
base=$bin/packaging/rootfs-bookworm.tar
part=$bin/packaging/rootfs-bookworm.part.tar # mmdebstrap's format follows the name: a tar
if [ ! -f "$base" ] || [ "$(cat "$base.includes" 2>/dev/null)" != "$needs" ]; then
    echo "making the base root filesystem (Debian 12 minbase + $needs)"
    rm -f "$base" "$base.includes"
    mkdir -p "$(dirname "$base")"
    if ! mmdebstrap --variant=minbase --include="$needs" bookworm "$part" >"$tmp/mm.log" 2>&1; then
        tail -n 20 "$tmp/mm.log" >&2
        rm -f "$part"
        skip "mmdebstrap could not make a Debian 12 root filesystem (no mirror reachable?)"
    fi
    mv "$part" "$base"
    printf '%s' "$needs" >"$base.includes"
fi
root=$tmp/root
mkdir "$root"
tar -C "$root" -xf "$base"
cp "${debs[@]}" "$root/tmp/"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -c "$1"; }

# Install: no error, no systemd here (postinst leaves units alone without /run/systemd/system).
if ! out=$(in_root 'dpkg -i /tmp/*.deb' 2>&1); then
    echo "$out" >&2
    bad "dpkg -i failed"
    exit 1
fi
n=$(in_root 'dpkg-query -W -f="\${Status}\n" kprof-agent kprof-collectord kprof-analyzer kprofctl' |
    grep -c "install ok installed" || true)
[ "$n" = 4 ] || bad "$n of the 4 packages are installed"
pw=$(in_root 'getent passwd kprof') || bad "no user kprof"
IFS=: read -r _ _ uid gid _ home shell <<<"$pw"
[ "$uid" -lt 1000 ] || bad "kprof is not a system user (uid $uid)"
[ "$home" = /var/lib/kprof ] && [ "$shell" = /usr/sbin/nologin ] || bad "kprof: home $home shell $shell"
[ "$(in_root 'getent group kprof' | cut -d: -f3)" = "$gid" ] || bad "kprof's group is not kprof"
in_root 'getent group kprof-users' | grep -q ':kprof$' || bad "kprof is not in kprof-users"
[ "$(in_root 'stat -c "%U:%G %a" /etc/kprof/tls')" = "root:kprof 750" ] ||
    bad "/etc/kprof/tls is $(in_root 'stat -c "%U:%G %a" /etc/kprof/tls')"
for p in kprof-agent kprof-collectord kprof-analyzer kprofctl; do
    in_root "dpkg-query -W -f='\${Conffiles}' $p" | grep -q "/etc/kprof/$p.conf" ||
        bad "$p: /etc/kprof/$p.conf is not a registered conffile"
done
# The installed layout works with only the Depends present.
for b in kprof-agent kprof-collectord kprof-analyzer kprofctl kprof-analyze; do
    in_root "$b --help >/dev/null 2>&1" || bad "$b --help fails in the clean root filesystem"
done
env_out=$(in_root 'kprof-run -q --print-env 2>/dev/null') || bad "kprof-run --print-env failed"
grep -qx "export CUDA_INJECTION64_PATH='/usr/lib/[a-z0-9_]*-linux-gnu/kprof/libkprof_inject.so'" \
    <<<"$env_out" || bad "kprof-run: $env_out"
# Each daemon reads its packaged settings.
for b in kprof-agent kprof-collectord kprof-analyzer; do
    in_root "$b --print-config >/dev/null" || bad "$b --print-config with /etc/kprof/$b.conf failed"
done

# A reinstall keeps an admin's edit of a conffile.
in_root 'echo "log-level = debug" >>/etc/kprof/kprof-agent.conf'
in_root 'dpkg -i /tmp/kprof-agent_*.deb >/dev/null 2>&1' || bad "reinstall of kprof-agent failed"
in_root 'grep -qx "log-level = debug" /etc/kprof/kprof-agent.conf' || bad "reinstall lost the admin's edit"

# remove keeps settings and spool; purge removes them, keeps the admin's TLS file and the user.
in_root 'mkdir -p /var/lib/kprof/spool && echo x >/var/lib/kprof/spool/batch && echo k >/etc/kprof/tls/agent.key'
in_root 'dpkg -r kprof-agent kprof-collectord kprof-analyzer kprofctl >/dev/null 2>&1' || bad "dpkg -r failed"
in_root 'test -f /etc/kprof/kprof-agent.conf && test -f /var/lib/kprof/spool/batch' ||
    bad "remove took the settings or the spool"
in_root 'test ! -e /usr/bin/kprof-agent && test ! -e /usr/bin/kprof-run' || bad "remove left the programs"
in_root 'dpkg --purge kprof-agent kprof-collectord kprof-analyzer kprofctl >/dev/null 2>&1' ||
    bad "dpkg --purge failed"
in_root 'test ! -e /etc/kprof/kprof-agent.conf && test ! -e /var/lib/kprof' ||
    bad "purge left the settings or the spool"
in_root 'test -f /etc/kprof/tls/agent.key' || bad "purge removed the admin's TLS file"
in_root 'getent passwd kprof >/dev/null' || bad "purge removed the user kprof"

[ "$fail" = 0 ] && echo "package lifecycle OK"
exit "$fail"
