#!/bin/bash
# unit.inject_fake_smoke: kprof-test-worker with libkprof_inject.so and the fake libcupti and
# no agent listening. Each run must finish every step, exit 0, and report the library dormant:
# not connected, no CUPTI kind enabled, the fake never asked to enable anything.
# usage: smoke.sh WORKER LIBKPROF_INJECT FAKECUPTI
set -u
worker=$1 lib=$2 fake=$3
tmp=$(mktemp -d /tmp/kprof-smoke.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export CUDA_INJECTION64_PATH=$lib NVTX_INJECTION64_PATH=$lib KPROF_CUPTI_PATH=$fake
export KPROF_AGENT_SOCKET=$tmp/no-agent.sock RANK=0 LOCAL_RANK=0 WORLD_SIZE=1
fail=0
steps=6

check() { # name, then worker flags
    local name=$1 rc
    shift
    timeout -k 5 90 "$worker" --steps $steps --step-ms 2 --stats --timeout-s 80 "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "FAIL $name: kprof-test-worker exited $rc"; fail=1
    fi
    if grep -qE 'Sanitizer|runtime error:' "$tmp/$name.err"; then
        echo "FAIL $name: sanitizer report"; fail=1
    fi
    python3 - "$tmp/$name.out" "$name" $steps "$*" <<'PY' || fail=1
import json, sys
path, name, steps, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
lines = [l for l in open(path) if l.startswith("{")]
if len(lines) != 1:
    print(f"FAIL {name}: expected one stats line, got {len(lines)}"); sys.exit(1)
s = json.loads(lines[0])
want = {"steps": steps, "library": True, "connected": 0, "enabled_kinds": 0, "captures": 0}
if "--no-hook" not in flags:
    want["current_step"] = steps - 1
bad = [f"{k}={s.get(k)!r} (want {v!r})" for k, v in want.items() if s.get(k) != v]
fake = s["fake"]
for k in ("enable_calls", "enabled_kinds", "enabled_mask", "records_total", "dropped"):
    if fake.get(k) != 0:
        bad.append(f"fake.{k}={fake.get(k)} (want 0)")
# The library found the fake (not some other libcupti, not none) and set it up.
if fake.get("registered") != 1:
    bad.append("fake.registered=%r: the library did not register buffer callbacks with the fake" % fake.get("registered"))
if bad:
    print(f"FAIL {name}: " + ", ".join(bad)); sys.exit(1)
print(f"ok   {name}: {lines[0].strip()}")
PY
    if [ $fail -ne 0 ]; then
        echo "--- stderr of $name:"; head -c 4000 "$tmp/$name.err"
    fi
}

check plain
check fork --fork
check no-hook --no-hook --fork
exit $fail
