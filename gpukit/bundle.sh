#!/usr/bin/env bash
# gpukit/bundle.sh: packs everything a GPU machine without kprof's dependencies needs to run the
# GPU validation kit into one folder and one tarball, then checks that every binary in it loads
# its libraries from inside the bundle.
#
#   gpukit/bundle.sh [--build DIR] [--out DIR] [--check-only]
#
#   --build DIR    kprof's build tree (default ./build); it must hold kprof-collectord,
#                  kprof-agent, kprof-analyzer, kprofctl, libkprof_inject.so and, for the dry
#                  run, kprof-test-worker and the fake libcupti
#   --out DIR      where to write (default ./.gpukit, ignored by git): DIR/root/ (the bundle,
#                  unpacked) and DIR/kprof-gpukit.tar.gz (what travels; at most 48 MiB)
#   --check-only   only the checks, on an existing DIR/root
#
# Layout of root/: build/{collectord,agent,analyzer,kprofctl}/ the daemons and the CLI where
# deploy/local/kprof-stack looks for them; build/agent/inject/libkprof_inject.so;
# build/tests/fakecupti/ the dry run's worker and fake libcupti; lib/ every shared library they
# load except glibc's own (the GPU image's glibc must be at least GLIBC_MAX in MANIFEST);
# bin/openssl and etc/openssl.cnf: the openssl command kprof-stack makes the stack's CA,
# certificates and tokens with (an image may have none, or one that does not match lib/);
# pg/lib/postgresql/N/{bin,lib} and pg/share/postgresql/N/ PostgreSQL's server (relocatable:
# it finds share/ relative to bin/), pg/zoneinfo/ the UTC time zone files; web/ the analyzer's
# pages (kprof-stack serves them); deploy/local/kprof-stack, agent/kprof-run, agent/python/
# and gpukit/ the scripts; src/ the injection library's sources, to rebuild it against another
# CUDA (gpukit/run-on-gpu.sh does when the bundled one does not load).
#
# The check (also run alone by --check-only): with LD_LIBRARY_PATH=root/lib, `ldd` of every ELF
# file must name no missing library and resolve every library but glibc's inside root/; each
# daemon and the CLI must answer --help. A missing library is found here, not on the GPU.
#
# Exit status: 0 bundle written and checked; 1 a check failed (what and why on stderr); 2 usage
# or a missing input.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
build=$src/build
out=$src/.gpukit
check_only=0
max_tar_bytes=$((48 * 1024 * 1024)) # the device carries 64 MiB, the source tree included

usage() { sed -n '5,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "gpukit/bundle.sh: $*" >&2; exit "${2:-1}"; }

while [ $# -gt 0 ]; do
  case $1 in
  --build) [ $# -ge 2 ] || usage; build=$2; shift 2 ;;
  --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
  --check-only) check_only=1; shift ;;
  -h | --help) usage ;;
  *) echo "gpukit/bundle.sh: unknown argument $1" >&2; usage ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$out/root

# glibc's own libraries: the GPU image brings these (a newer glibc runs older binaries).
is_glibc() {
  case $1 in
  linux-vdso.so.* | ld-linux-x86-64.so.* | ld-linux-aarch64.so.* | libc.so.* | libm.so.* | \
    libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | \
    libnss_*.so.* | libmvec.so.* | libBrokenLocale.so.*) return 0 ;;
  esac
  return 1
}

is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' \n')" = '177ELF' ]; }

# Copies the libraries $1 loads (as ldd resolves them here) into root/lib.
copy_deps() {
  local f=$1 name arrow path rest
  while read -r name arrow path rest; do
    [ "$arrow" = "=>" ] || continue
    is_glibc "$name" && continue
    [ "$path" != "not" ] || die "$f needs $name, which is not installed here"
    [ -e "$root/lib/$name" ] || cp -L "$path" "$root/lib/$name"
  done < <(ldd "$f")
}

build_bundle() {
  local pgbin pgver b
  pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$pgbin" ] || die "PostgreSQL is not installed here (deploy/local/install-deps.sh)" 2
  pgver=$(basename "$(dirname "$pgbin")")
  for b in collectord/kprof-collectord agent/kprof-agent analyzer/kprof-analyzer \
    kprofctl/kprofctl agent/inject/libkprof_inject.so tests/fakecupti/kprof-test-worker \
    tests/fakecupti/libkprof_fakecupti.so; do
    [ -f "$build/$b" ] || die "$build/$b is missing: build kprof first (cmake --build $build)" 2
  done
  command -v openssl >/dev/null || die "openssl is not installed here (deploy/local/install-deps.sh)" 2
  rm -rf "$root"
  mkdir -p "$root/lib" "$root/build/tests/fakecupti" "$root/pg/lib/postgresql/$pgver/lib" \
    "$root/pg/share/postgresql" "$root/deploy/local" "$root/agent" "$root/src"
  for b in collectord/kprof-collectord agent/kprof-agent analyzer/kprof-analyzer \
    kprofctl/kprofctl agent/inject/libkprof_inject.so tests/fakecupti/kprof-test-worker; do
    mkdir -p "$root/build/$(dirname "$b")"
    cp "$build/$b" "$root/build/$b"
  done
  # The openssl command, for kprof-stack's credentials; its libraries come with the rest.
  mkdir -p "$root/bin" "$root/etc"
  cp -L "$(command -v openssl)" "$root/bin/openssl"
  if [ -f /usr/lib/ssl/openssl.cnf ]; then
    cp -L /usr/lib/ssl/openssl.cnf "$root/etc/openssl.cnf"
  else
    printf '[req]\ndistinguished_name = dn\n[dn]\n' >"$root/etc/openssl.cnf"
  fi
  # The worker finds its fake through the loader: one copy, in lib/.
  cp "$build/tests/fakecupti/libkprof_fakecupti.so" "$root/lib/"
  # PostgreSQL: what kprof-stack runs, and the server's modules (JIT left out: its provider
  # loads LLVM, tens of MiB, and a server without it just runs without JIT).
  cp -a "$pgbin" "$root/pg/lib/postgresql/$pgver/bin"
  find "$root/pg/lib/postgresql/$pgver/bin" -mindepth 1 -maxdepth 1 \
    ! \( -name postgres -o -name initdb -o -name pg_ctl -o -name psql -o -name createdb \
    -o -name pg_isready \) -exec rm -rf {} +
  find "/usr/lib/postgresql/$pgver/lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' \
    -exec cp {} "$root/pg/lib/postgresql/$pgver/lib/" \;
  cp -a "/usr/share/postgresql/$pgver" "$root/pg/share/postgresql/$pgver"
  # Debian's PostgreSQL reads time zones from /usr/share/zoneinfo: the few it needs under UTC,
  # for an image without tzdata (run-on-gpu.sh copies them there when they are missing).
  mkdir -p "$root/pg/zoneinfo/Etc"
  cp -L /usr/share/zoneinfo/UTC /usr/share/zoneinfo/GMT "$root/pg/zoneinfo/"
  cp -L /usr/share/zoneinfo/Etc/UTC /usr/share/zoneinfo/Etc/GMT "$root/pg/zoneinfo/Etc/"
  # Scripts and the injection library's sources.
  cp "$src/deploy/local/kprof-stack" "$root/deploy/local/"
  cp -r "$src/web" "$root/web"
  cp "$src/agent/kprof-run" "$root/agent/"
  cp -r "$src/agent/python" "$root/agent/python"
  find "$root/agent/python" -name '__pycache__' -prune -exec rm -rf {} +
  mkdir -p "$root/gpukit"
  cp "$here"/*.sh "$here"/*.py "$here"/README.md "$root/gpukit/"
  mkdir -p "$root/src/agent/inject" "$root/src/common"
  cp "$src"/agent/inject/*.c "$src"/agent/inject/*.h "$src"/agent/inject/exports.map \
    "$root/src/agent/inject/"
  cp "$src/common/kp_wire.c" "$src/common/kp_wire.h" "$root/src/common/"
  # Every ELF file's libraries into lib/, until nothing new appears (libraries of libraries).
  local n=-1 m
  while :; do
    while IFS= read -r -d '' f; do
      is_elf "$f" && copy_deps "$f"
    done < <(find "$root" -type f -print0)
    m=$(find "$root/lib" -type f | wc -l)
    [ "$m" != "$n" ] || break
    n=$m
  done
}

# Highest GLIBC_x.y symbol version any bundled ELF file needs.
glibc_max() {
  find "$root" -type f -print0 | while IFS= read -r -d '' f; do
    is_elf "$f" && objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' || true
  done | sed 's/GLIBC_//' | sort -V | tail -n 1
}

check_bundle() {
  local bad=0 f name arrow path rest libpath
  [ -d "$root" ] || die "no bundle at $root (run gpukit/bundle.sh first)" 2
  libpath=$root/lib
  while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    while read -r name arrow path rest; do
      [ "$arrow" = "=>" ] || continue
      if [ "$path" = "not" ]; then
        echo "gpukit/bundle.sh: ${f#"$root"/} needs $name: not found in the bundle" >&2
        bad=1
      elif ! is_glibc "$name" && [ "${path#"$root"/}" = "$path" ]; then
        echo "gpukit/bundle.sh: ${f#"$root"/} loads $name from $path, outside the bundle" >&2
        bad=1
      fi
    done < <(LD_LIBRARY_PATH=$libpath ldd "$f" 2>&1)
  done < <(find "$root" -type f -print0)
  for b in collectord/kprof-collectord agent/kprof-agent analyzer/kprof-analyzer kprofctl/kprofctl; do
    if ! LD_LIBRARY_PATH=$libpath "$root/build/$b" --help >/dev/null 2>&1; then
      echo "gpukit/bundle.sh: build/$b --help failed with the bundle's libraries" >&2
      bad=1
    fi
  done
  if ! LD_LIBRARY_PATH=$libpath OPENSSL_CONF=$root/etc/openssl.cnf "$root/bin/openssl" rand -hex 4 >/dev/null 2>&1; then
    echo "gpukit/bundle.sh: the bundled openssl does not run" >&2
    bad=1
  fi
  if ! LD_LIBRARY_PATH=$libpath "$(ls -d "$root"/pg/lib/postgresql/*/bin)/postgres" --version >/dev/null 2>&1; then
    echo "gpukit/bundle.sh: the bundled postgres does not run" >&2
    bad=1
  fi
  [ "$bad" = 0 ] || die "the bundle's ldd check failed"
}

if [ "$check_only" = 0 ]; then
  build_bundle
  {
    echo "kprof-gpukit bundle"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(uname -m)"
    echo "source $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$src" diff --quiet HEAD 2>/dev/null || echo '+changes')"
    echo "GLIBC_MAX $(glibc_max)"
    echo "CUPTI_HEADERS $(grep -h -m1 'define CUPTI_API_VERSION' "$(sed -n 's/^KP_CUDA_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")/cupti_version.h" 2>/dev/null | awk '{print $3}')"
    echo "files:"
    (cd "$root" && find . -type f -printf '%s %p\n' | sort -k2)
  } >"$root/MANIFEST"
fi
check_bundle
if [ "$check_only" = 0 ]; then
  tar -C "$out" -czf "$out/kprof-gpukit.tar.gz.tmp" root
  mv "$out/kprof-gpukit.tar.gz.tmp" "$out/kprof-gpukit.tar.gz"
  size=$(stat -c %s "$out/kprof-gpukit.tar.gz")
  [ "$size" -le "$max_tar_bytes" ] ||
    die "$out/kprof-gpukit.tar.gz is $size bytes, over the $max_tar_bytes the device can carry with the source tree"
  echo "gpukit: bundle $out/kprof-gpukit.tar.gz ($((size / 1024)) KiB; unpacked $(du -sk "$root" | cut -f1) KiB), ldd check passed, glibc >= $(sed -n 's/^GLIBC_MAX //p' "$root/MANIFEST") needed"
else
  echo "gpukit: $root passed the ldd check"
fi
