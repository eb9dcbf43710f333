#!/usr/bin/env bash
# The systemd units (packaging/systemd/): `systemd-analyze verify` passes on each, with ExecStart
# pointed at the built binary (verify checks that it exists and is executable); each is hardened
# as docs/packaging.md says; the agent's socket and spool agree with kprof-run's and the agent's
# defaults. Exits 77 (skipped) where systemd-analyze is missing.
# Usage: test_units.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 bin=$2
units=$src/packaging/systemd
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

if ! command -v systemd-analyze >/dev/null; then
    echo "SKIP: systemd-analyze not found (Debian package systemd)" >&2
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

declare -A built=([kprof-collectord]=collectord/kprof-collectord
    [kprof-analyzer]=analyzer/kprof-analyzer [kprof-agent]=agent/kprof-agent)
for prog in kprof-collectord kprof-analyzer kprof-agent; do
    u=$units/$prog.service
    [ -f "$u" ] || { bad "$u missing"; continue; }
    [ -x "$bin/${built[$prog]}" ] || { bad "$bin/${built[$prog]} not built"; continue; }
    sed "s|^ExecStart=/usr/bin/$prog|ExecStart=$bin/${built[$prog]}|" "$u" >"$tmp/$prog.service"
    grep -q "^ExecStart=$bin/" "$tmp/$prog.service" || bad "$prog: ExecStart is not /usr/bin/$prog"
    if ! out=$(systemd-analyze verify "$tmp/$prog.service" 2>&1) || [ -n "$out" ]; then
        bad "$prog: systemd-analyze verify: $out"
    fi
    # The hardening every daemon gets.
    for want in Type=notify User=kprof NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes \
        PrivateTmp=yes PrivateDevices=yes CapabilityBoundingSet= \
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6" SystemCallFilter=@system-service \
        LimitNOFILE=65536; do
        grep -qx -- "$want" "$u" || bad "$prog: no line $want"
    done
    # Exposure as systemd rates it (0 best, 10 worst): "OK" is below 4.
    if systemd-analyze security --help 2>/dev/null | grep -q -- --offline; then
        score=$(systemd-analyze security --offline=yes "$tmp/$prog.service" 2>/dev/null |
            sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
        echo "$prog: exposure $score"
        awk -v s="$score" 'BEGIN { exit !(s != "" && s + 0 < 2.5) }' ||
            bad "$prog: systemd-analyze security exposure ${score:-?}, want below 2.5"
    fi
done

# The agent: its socket is kprof-run's default and the library's, in its RuntimeDirectory; its
# spool in its StateDirectory; the socket's group is the training users'.
agent=$units/kprof-agent.service
sock=$(sed -n 's|^ExecStart=.* --socket=\([^ ]*\).*|\1|p' "$agent")
wire=$(sed -n 's|^#define KP_WIRE_DEFAULT_SOCKET *"\(.*\)".*|\1|p' "$src/common/kp_wire.h")
run=$(sed -n 's|^DEFAULT_SOCKET=\([^ ]*\).*|\1|p' "$src/agent/kprof-run")
[ -n "$sock" ] && [ "$sock" = "$wire" ] && [ "$sock" = "$run" ] ||
    bad "agent socket: unit '$sock', kp_wire.h '$wire', kprof-run '$run' differ"
rd=$(sed -n 's|^RuntimeDirectory=||p' "$agent")
[ "$(dirname "$sock")" = "/run/$rd" ] || bad "agent socket $sock is not in RuntimeDirectory=$rd"
grep -qx "RuntimeDirectoryMode=0750" "$agent" || bad "agent: RuntimeDirectoryMode is not 0750"
grep -qx "Group=kprof-users" "$agent" || bad "agent: socket group is not kprof-users"
# The group that reaches the socket is the group the agent lets in.
grep -q "^ExecStart=.* --allow-group=kprof-users" "$agent" || bad "agent: no --allow-group=kprof-users"
spool=$(sed -n 's|^ExecStart=.* --spool-dir=\([^ ]*\).*|\1|p' "$agent")
sd=$(sed -n 's|^StateDirectory=||p' "$agent")
case $spool in "/var/lib/$sd"/*) ;; *) bad "agent spool $spool is not in StateDirectory=$sd" ;; esac
for want in MemoryMax= CPUQuota=; do
    grep -q "^$want" "$agent" || bad "agent: no $want (the node's jobs come first)"
done
# The flags the unit passes exist in the agent (it would refuse to start otherwise).
"$bin/agent/kprof-agent" $(sed -n 's|^ExecStart=[^ ]*||p' "$agent") --nvidia-params= --dry-run \
    >/dev/null || bad "kprof-agent does not take the unit's flags"

[ "$fail" = 0 ] && echo "units OK"
exit "$fail"
