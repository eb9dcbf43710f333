#!/bin/bash
# bench/capture/run.sh: runs kprof-bench-capture 3 times per mode, alternating baseline and
# library in fresh processes, and prints the median ns/record of each and their ratio.
# usage: run.sh [--build DIR] [--launches M] [--quick]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/../../build
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --launches) args+=(--launches "$2"); shift 2 ;;
    --quick) args+=(--quick); shift ;;
    *) echo "usage: $0 [--build DIR] [--launches M] [--quick]" >&2; exit 2 ;;
    esac
done
bin=$build/bench/capture/kprof-bench-capture
[ -x "$bin" ] || { echo "no $bin: build target kprof-bench-capture first" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for i in 1 2 3; do
    for mode in base lib; do
        "$bin" --mode $mode "${args[@]}" | tee -a "$out" | grep '^RESULT' || {
            echo "run $i ($mode) failed" >&2; exit 1; }
    done
done
python3 - "$out" <<'PY'
import re, statistics, sys
vals = {"base": [], "lib": []}
for line in open(sys.argv[1]):
    m = re.match(r"RESULT mode=(\w+) ns_per_record=([\d.]+)", line)
    if m:
        vals[m.group(1)].append(float(m.group(2)))
b, l = statistics.median(vals["base"]), statistics.median(vals["lib"])
print(f"median baseline (walk + copy): {b:.1f} ns/record  runs={vals['base']}")
print(f"median library decode+handoff: {l:.1f} ns/record  runs={vals['lib']}")
print(f"ratio library/baseline: {l / b:.2f}")
print(f"target < 50 ns/record: {'met' if l < 50 else 'NOT met'}")
PY
