#!/usr/bin/env bash
# gpukit/run-on-gpu.sh: the GPU validation kit's one command. Runs kprof's capture and
# torch.profiler on the same small PyTorch job and writes everything the verdict needs.
#
#   bash gpukit/run-on-gpu.sh [--dry-run] [--bundle TARBALL] [--out DIR]
#
# Phases, each bounded in time, each packed into $OUT as soon as it ends (a phase that fails
# loses nothing of the others):
#   setup      unpack the bundle (.gpukit/kprof-gpukit.tar.gz from gpukit/bundle.sh, unless this
#              script runs from inside an unpacked one), check glibc, load or rebuild
#              libkprof_inject.so against the CUDA here, find the libcupti torch uses
#              (KPROF_CUPTI_PATH), make a user for PostgreSQL when running as root
#   stack      deploy/local/kprof-stack up from the bundle, on free ports: TLS and tokens, as
#              the local stack always is (kprofctl uses its CA and operator token)
#   baseline   the job (gpukit/job_torch.py: 2 ranks, 30 steps) without kprof
#   dormant    the same under kprof-run, no capture
#   capture    the same under kprof-run; `kprofctl start --ranks all --steps 5` once both ranks
#              run (timed so the window starts near step 20), `kprofctl status --watch` until
#              done; then kprofctl status/export and the analyzer's breakdown, kernels and ops
#              (--json) per rank
#   torchprof  the job with torch.profiler recording the steps kprof captured (never both in
#              one process: CUPTI takes one activity client)
# --dry-run: kprof-test-worker and the fake libcupti stand in for PyTorch and the GPU
# (gpukit/job_fake.py); the ctest it.test_gpukit runs it.
#
# Output ($OUT, else ./gpukit-out): gpukit.log (this log), gpukit-results.tar.gz (results/:
# summary.json, setup.json, and per phase its job's files and logs), each rewritten after
# every phase, and at the end gpukit-report.txt, the verdict on them (also printed). Then,
# where the files land: python3 gpukit/verdict.py gpukit-results.tar.gz.
# Exit status: 0 every phase ran; 1 a phase failed (summary.json and the log say which);
# 2 usage or no bundle.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dry=0 bundle='' out=${OUT:-$PWD/gpukit-out}
while [ $# -gt 0 ]; do
  case $1 in
  --dry-run) dry=1; shift ;;
  --bundle) bundle=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  -h | --help) sed -n '5,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run-on-gpu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out" && out=$(cd "$out" && pwd)
t_start=$(date +%s)
# Every phase ends by this many seconds after the start (partial results are packed as each
# phase ends): the device runs one command for at most 10 minutes; 380 s leaves a rerun room.
t_end=$((t_start + ${GPUKIT_DEADLINE_S:-380}))
steps=30
job_name=gpukit-$$

# ---- the bundle ----------------------------------------------------------------------------------
if [ -f "$here/../MANIFEST" ] && [ -d "$here/../build" ]; then
  root=$(cd "$here/.." && pwd)
  work=$(mktemp -d /tmp/gpukit.XXXXXX)
  if [ "$(id -u)" = 0 ]; then # PostgreSQL's user may not reach a bundle under /root: a copy
    cp -a "$root" "$work/root" && root=$work/root
  fi
else
  [ -n "$bundle" ] || bundle=$here/../.gpukit/kprof-gpukit.tar.gz
  if [ ! -f "$bundle" ]; then
    echo "run-on-gpu.sh: no bundle at $bundle: run gpukit/bundle.sh first (and carry .gpukit/kprof-gpukit.tar.gz)" >&2
    exit 2
  fi
  work=$(mktemp -d /tmp/gpukit.XXXXXX)
  tar -C "$work" -xzf "$bundle" || { echo "run-on-gpu.sh: cannot unpack $bundle" >&2; exit 2; }
  root=$work/root
fi
chmod 755 "$work" # PostgreSQL runs as another user: it must reach the bundle's binaries
res=$work/results
mkdir -p "$res"
exec > >(tee -a "$out/gpukit.log") 2>&1
log() { printf '[gpukit %4ds] %s\n' $(($(date +%s) - t_start)) "$*"; }

# results/summary.json: one line per phase, rewritten as phases end.
phases=()
note_phase() { # name status seconds detail
  phases+=("$(printf '{"phase": "%s", "status": "%s", "seconds": %s, "detail": %s}' "$1" "$2" "$3" \
    "$(printf '%s' "$4" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')")")
  {
    printf '{"dry_run": %s, "job": "%s", "phases": [' "$([ $dry = 1 ] && echo true || echo false)" "$job_name"
    local i
    for i in "${!phases[@]}"; do [ "$i" = 0 ] || printf ', '; printf '%s' "${phases[$i]}"; done
    printf ']}\n'
  } >"$res/summary.json"
  pack
}
# The device returns files of at most 16 MiB: a file over 6 MiB (a runaway log) stays out of
# the tarball and is named in results/left-out.txt.
pack() {
  cp "$out/gpukit.log" "$res/gpukit.log" 2>/dev/null
  cp "$stack_dir"/*.log "$res/stack/" 2>/dev/null
  (cd "$work" && find results -type f -size +6M -printf '%p\n') >"$work/left-out"
  if [ -s "$work/left-out" ]; then
    (cd "$work" && find results -type f -size +6M -printf '%p %s bytes\n') >"$res/left-out.txt"
  fi
  tar -C "$work" -czf "$out/gpukit-results.tar.gz.tmp" -X "$work/left-out" results 2>/dev/null &&
    mv "$out/gpukit-results.tar.gz.tmp" "$out/gpukit-results.tar.gz"
}
failed=0
phase_rc() { # name rc t0 detail
  local st=ok
  [ "$2" = 0 ] || { st=failed; failed=1; }
  [ "$2" != 125 ] || st=skipped # out of time before it began
  log "phase $1: $st (status $2) $4"
  note_phase "$1" "$st" $(($(date +%s) - $3)) "$4"
}

stack_dir=$work/stack
mkdir -p "$res/stack"
# The bundle's openssl (it matches lib/) makes the stack's CA, certificates and tokens.
stack() { LD_LIBRARY_PATH=$root/lib KPROF_STACK_DIR=$stack_dir KPROF_BUILD_DIR=$root/build \
  KPROF_PG_BIN=$pgbin PATH=$root/bin:$PATH OPENSSL_CONF=$root/etc/openssl.cnf \
  timeout 120 bash "$root/deploy/local/kprof-stack" "$@"; }
kctl() { LD_LIBRARY_PATH=$root/lib timeout 30 "$root/build/kprofctl/kprofctl" "$@"; }
cleanup() {
  [ -n "${job_pid:-}" ] && kill "$job_pid" 2>/dev/null
  [ -n "${pgbin:-}" ] && stack down >/dev/null 2>&1
  pack
  [ "$dry" = 1 ] && rm -rf "$work"
}
trap cleanup EXIT

# ---- setup ---------------------------------------------------------------------------------------
t0=$(date +%s)
log "bundle $root ($(sed -n 2,3p "$root/MANIFEST" | tr '\n' ' '))"
pgbin=$(ls -d "$root"/pg/lib/postgresql/*/bin | tail -n 1)
inject=$root/build/agent/inject/libkprof_inject.so
setup_err=''
need=$(sed -n 's/^GLIBC_MAX //p' "$root/MANIFEST")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
  setup_err="glibc $have here, the bundle needs $need: build the bundle on an older distribution"
fi
if [ "$dry" = 1 ]; then
  job=(python3 "$root/gpukit/job_fake.py" --worker "$root/build/tests/fakecupti/kprof-test-worker"
    --step-ms "${GPUKIT_FAKE_STEP_MS:-20}")
  cupti='the fake (kprof-test-worker sets KPROF_CUPTI_PATH to its own)'
  inject_how='bundled'
else
  job=(python3 "$root/gpukit/job_torch.py")
  nvidia-smi >"$res/nvidia-smi.txt" 2>&1
  # The libcupti this torch loads (one copy in the process), else the first one found.
  cupti=$(timeout 90 python3 - <<'PY' 2>"$res/find-cupti.err"
import glob, os, site, sys
import torch
torch.cuda.init()
try:  # a moment of torch.profiler makes Kineto load the libcupti it uses
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
except Exception as e:
    print("torch.profiler: %s" % e, file=sys.stderr)
with open("/proc/self/maps") as f:
    m = sorted({l.split()[-1] for l in f if "libcupti.so" in l})
if m:
    print(m[0]); sys.exit(0)
dirs = site.getsitepackages() + [os.path.dirname(torch.__file__) + "/.."]
pats = ["nvidia/cu*/lib/libcupti.so*", "nvidia/cuda_cupti/lib/libcupti.so*", "torch/lib/libcupti*.so*"]
c = [p for d in dirs for pat in pats for p in sorted(glob.glob(os.path.join(d, pat)))]
c += sorted(glob.glob("/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*")) + sorted(glob.glob("/usr/local/cuda*/lib64/libcupti.so*"))
if c:
    print(os.path.realpath(c[0]))
PY
)
  if [ -z "$cupti" ]; then
    setup_err="${setup_err:+$setup_err; }no libcupti found (see find-cupti.err)"
  else
    export KPROF_CUPTI_PATH=$cupti
  fi
  # The bundled library links only glibc: load it; rebuild it from the bundled sources
  # against this CUDA's cupti.h when it does not.
  inject_how=bundled
  if ! python3 -c "import ctypes,sys; ctypes.CDLL(sys.argv[1]).kprof_step" "$inject" 2>"$res/inject-load.err"; then
    inc=$(dirname "$(ls /usr/local/cuda*/include/cupti.h /usr/local/cuda*/extras/CUPTI/include/cupti.h 2>/dev/null | head -n 1)")
    mkdir -p "$work/inject"
    if cc -O2 -fPIC -shared -fvisibility=hidden -std=gnu11 -I"$root/src/agent/inject" -I"$root/src/common" \
      -I"$inc" -Wl,--version-script="$root/src/agent/inject/exports.map" -o "$work/inject/libkprof_inject.so" \
      "$root"/src/agent/inject/*.c "$root/src/common/kp_wire.c" -lpthread -ldl 2>"$res/inject-build.err"; then
      inject=$work/inject/libkprof_inject.so
      inject_how="rebuilt here against $inc"
    else
      setup_err="${setup_err:+$setup_err; }libkprof_inject.so neither loads nor builds (inject-*.err)"
    fi
  fi
fi
# PostgreSQL refuses to run as root: as root, run it as postgres, or a user made for it.
# It runs in the C locale and UTC (an image may lack locales and tzdata: then the bundle's UTC
# files go where Debian's PostgreSQL reads them).
export LC_ALL=C TZ=UTC
if [ ! -e /usr/share/zoneinfo/UTC ]; then
  if mkdir -p /usr/share/zoneinfo 2>/dev/null && cp -rn "$root/pg/zoneinfo/." /usr/share/zoneinfo/; then
    log "no tzdata here: installed the bundle's UTC files in /usr/share/zoneinfo"
  else
    log "warning: no /usr/share/zoneinfo/UTC and no right to install it; PostgreSQL may refuse to start"
  fi
fi
pguser=
if [ "$(id -u)" = 0 ]; then
  command -v runuser >/dev/null || setup_err="${setup_err:+$setup_err; }runuser is missing (kprof-stack runs PostgreSQL through it as root)"
  if id postgres >/dev/null 2>&1; then pguser=postgres; else
    pguser=kprofpg
    id "$pguser" >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /bin/sh "$pguser" 2>>"$res/setup.err" ||
      { echo "$pguser:x:971:971::/nonexistent:/bin/sh" >>/etc/passwd && echo "$pguser:x:971:" >>/etc/group; }
  fi
  export KPROF_PG_USER=$pguser
fi
python3 - "$res/setup.json" <<PY
import json, sys
json.dump({"dry_run": $dry == 1, "libcupti": """$cupti""", "inject": "$inject", "inject_how": "$inject_how",
           "glibc_here": "$have", "glibc_needed": "$need", "pg_user": "$pguser", "uname": "$(uname -srm)",
           "error": """$setup_err"""}, open(sys.argv[1], "w"), indent=1)
PY
phase_rc setup "$([ -z "$setup_err" ] && echo 0 || echo 1)" "$t0" "$setup_err"
[ -z "$setup_err" ] || exit 1
log "libcupti: $cupti; inject: $inject ($inject_how)"

# ---- stack ---------------------------------------------------------------------------------------
t0=$(date +%s)
read -r p1 p2 p3 p4 p5 < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(5)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
export KPROF_PG_PORT=$p1 KPROF_COLLECTOR_PORT=$p2 KPROF_COLLECTOR_HTTP_PORT=$p3 KPROF_ANALYZER_PORT=$p4 KPROF_ANALYZER_HTTP_PORT=$p5
stack up >"$res/stack/up.txt" 2>&1
rc=$?
cat "$res/stack/up.txt"
# The stack serves TLS and takes only callers with a token: kprofctl gets its CA and the
# operator token, as `kprof-stack up` prints them.
eval "$(sed -n 's/^ *export \(KPROF_TLS_CA\|KPROF_TOKEN_FILE\)=/export \1=/p' "$res/stack/up.txt")"
if [ $rc = 0 ] && { [ -z "${KPROF_TLS_CA:-}" ] || [ -z "${KPROF_TOKEN_FILE:-}" ]; }; then
  echo "kprof-stack up printed no KPROF_TLS_CA or KPROF_TOKEN_FILE (not found)" >>"$res/stack/up.txt"
  rc=1
fi
phase_rc stack $rc "$t0" "$(grep -m1 -i 'fail\|error\|not' "$res/stack/up.txt")"
[ $rc = 0 ] || exit 1
export KPROF_COLLECTOR=127.0.0.1:$p2 KPROF_ANALYZER=127.0.0.1:$p4
pghost=$(sed -n 's/.*PostgreSQL *host=\([^ ]*\).*/\1/p' "$res/stack/up.txt")
export KPROF_PG="host=$pghost port=$p1 user=kprof dbname=kprof"
sock=$stack_dir/agent.sock
kprun=(sh "$root/agent/kprof-run" --socket "$sock" --lib "$inject")

# ---- the runs ------------------------------------------------------------------------------------
# The seconds a phase may take: at most $1, and what the deadline leaves (less 15 s to pack).
limit() {
  local left=$((t_end - $(date +%s) - 15))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
run_job() { # phase limit_s job args...
  local name=$1 lim
  lim=$(limit "$2")
  shift 2
  mkdir -p "$res/$name"
  if [ "$lim" -lt 20 ]; then
    log "phase $name: skipped, only $lim s left before the ${GPUKIT_DEADLINE_S:-380} s deadline"
    return 125
  fi
  log "phase $name (at most $lim s): $*"
  timeout -k 5 "$lim" "$@" >"$res/$name/job.log" 2>&1
}

t0=$(date +%s)
run_job baseline 100 "${job[@]}" --out "$res/baseline" --steps $steps
rc=$?
phase_rc baseline $rc "$t0" "no kprof$([ $rc = 124 ] && echo ': killed at its time limit')"

t0=$(date +%s)
job_name=gpukit-dormant-$$
run_job dormant 100 "${kprun[@]}" --job "$job_name" -- "${job[@]}" --out "$res/dormant" --steps $steps
rc=$?
phase_rc dormant $rc "$t0" "kprof-run, no capture$([ $rc = 124 ] && echo ': killed at its time limit')"

# capture: the job waits on a hold file past its 30 steps until kprof's window is over.
# Prints the error, if any; the run id goes to $res/capture/run.
capture_phase() {
  local run='' err='' deadline go jrc
  mkdir -p "$res/capture"
  job_name=gpukit-capture-$$
  touch "$work/hold"
  log "phase capture (at most $(limit 180) s): kprof-run --job $job_name -- ${job[*]}" >&2
  timeout -k 5 "$(limit 180)" "${kprun[@]}" --job "$job_name" -- "${job[@]}" --out "$res/capture" \
    --steps $steps --hold-file "$work/hold" >"$res/capture/job.log" 2>&1 &
  job_pid=$!
  # Start once both ranks report a step rate, timed so that the window (collectord picks the
  # start step: the furthest rank's step + 2 + 1 s worth of steps) begins near step 20.
  deadline=$(($(date +%s) + $(limit 90)))
  while :; do
    if [ "$(date +%s)" -ge "$deadline" ]; then err="the job's 2 ranks did not register with a step rate in time"; break; fi
    if ! kill -0 "$job_pid" 2>/dev/null; then err="the job ended before the capture started"; break; fi
    kctl jobs --job "$job_name" --json >"$work/jobs.json" 2>/dev/null
    go=$(python3 - "$work/jobs.json" <<'PY'
import json, math, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception:
    rows = []
rows = [r for r in rows if r.get("step") is not None and r.get("step_us")]
if len(rows) < 2:
    print("wait"); sys.exit()
mx = max(r["step"] for r in rows)
fastest = min(r["step_us"] for r in rows) / 1000.0  # ms per step
print("go" if mx + 2 + math.ceil(1000 / fastest) >= 20 else "wait")
PY
)
    [ "$go" = go ] && break
    sleep 0.05
  done
  if [ -z "$err" ]; then
    cp "$work/jobs.json" "$res/capture/jobs.json"
    run=$(kctl start --job "$job_name" --ranks all --steps 5 2>"$res/capture/start.err")
    if [ -z "$run" ]; then
      err="kprofctl start failed: $(head -c 300 "$res/capture/start.err")"
    else
      echo "$run" >"$res/capture/run"
      log "capture run $run: $(cat "$res/capture/start.err")" >&2
      LD_LIBRARY_PATH=$root/lib timeout "$(limit 120)" "$root/build/kprofctl/kprofctl" status --run "$run" \
        --watch --interval 500ms >"$res/capture/status-watch.txt" 2>&1 ||
        err="kprofctl status --watch: the capture did not end with every rank done"
    fi
  fi
  rm -f "$work/hold"
  wait "$job_pid"
  jrc=$?
  job_pid=
  [ $jrc = 0 ] || err="${err:+$err; }the job exited with status $jrc (capture/job.log)"
  if [ -n "$run" ]; then
    kctl status --run "$run" --json >"$res/capture/status.json" 2>&1
    mkdir -p "$res/capture/export"
    kctl export --run "$run" -o "$res/capture/export/" >"$res/capture/export.log" 2>&1 ||
      err="${err:+$err; }kprofctl export failed"
    local r v
    for r in 0 1; do
      for v in breakdown kernels ops; do
        kctl "$v" --run "$run" --rank $r --json >"$res/capture/analyzer-$v.rank-$r.json" \
          2>"$res/capture/analyzer-$v.rank-$r.err" || err="${err:+$err; }kprofctl $v --rank $r failed"
      done
    done
  fi
  printf '%s' "$err"
}
t0=$(date +%s)
if [ "$(limit 180)" -lt 20 ]; then
  log "phase capture: skipped, only $(limit 180) s left before the ${GPUKIT_DEADLINE_S:-380} s deadline"
  phase_rc capture 125 "$t0" "out of time"
else
  cap_err=$(capture_phase)
  phase_rc capture "$([ -z "$cap_err" ] && echo 0 || echo 1)" "$t0" "${cap_err:-run $(cat "$res/capture/run" 2>/dev/null)}"
fi

# torchprof: the steps kprof captured (else 20..24).
t0=$(date +%s)
span=$(python3 - "$res/capture/status.json" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))[0]["steps"]
    a, b = (int(x) for x in s.split("-"))
    print("%d:%d" % (a, b))
except Exception:
    print("20:24")
PY
)
run_job torchprof 150 "${job[@]}" --out "$res/torchprof" --steps $steps --profile-steps "$span"
rc=$?
phase_rc torchprof $rc "$t0" "torch.profiler on steps $span$([ $rc = 124 ] && echo ': killed at its time limit')"

log "done in $(($(date +%s) - t_start)) s; results in $out/gpukit-results.tar.gz"
pack
# A first look, in the command's own output: the verdict (gpukit/verdict.py, standard library
# only) on what is about to come back. The one that counts is computed again where it lands.
timeout 60 python3 "$root/gpukit/verdict.py" "$out/gpukit-results.tar.gz" --report "$out/gpukit-report.txt"
exit $failed
