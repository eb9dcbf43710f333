#!/usr/bin/env bash
# The Debian packages (packaging/cpack.cmake), made by cpack from this build tree into a temporary
# directory: their names, file lists, Depends (each shared library a binary needs is provided by
# a package in Depends, as dpkg-shlibdeps found it), conffiles and maintainer scripts; the
# unpacked tree works (kprof-run finds the library and hook next to itself, the binaries run,
# the units verify against the unpacked binaries); lintian reports no error.
# Exits 77 (skipped) where dpkg-deb, dpkg-shlibdeps or lintian is missing.
# Usage: test_debs.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 bin=$2
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

for t in dpkg-deb dpkg-shlibdeps cpack readelf; do
    if ! command -v "$t" >/dev/null; then
        echo "SKIP: $t not found (deploy/local/install-deps.sh installs it)" >&2
        exit 77
    fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
if ! cpack --config "$bin/CPackConfig.cmake" -G DEB -B "$tmp/out" >"$tmp/cpack.log" 2>&1; then
    cat "$tmp/cpack.log" >&2
    bad "cpack failed"
    exit 1
fi
echo "cpack: $(($(date +%s) - start)) s"
version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")/\1/p' "$bin/CPackConfig.cmake")
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
kdir=usr/lib/$multiarch/kprof

# package -> files it must hold (paths in the package, without the leading ./)
declare -A files=(
    [kprof-agent]="usr/bin/kprof-agent usr/bin/kprof-run $kdir/kprof-run $kdir/libkprof_inject.so
        $kdir/python/sitecustomize.py $kdir/python/kprof_hook.py etc/kprof/kprof-agent.conf
        lib/systemd/system/kprof-agent.service usr/share/doc/kprof-agent/copyright
        usr/share/doc/kprof-agent/changelog.gz"
    [kprof-collectord]="usr/bin/kprof-collectord etc/kprof/kprof-collectord.conf
        lib/systemd/system/kprof-collectord.service usr/share/kprof/migrations/0001_init.sql
        usr/share/doc/kprof-collectord/copyright"
    [kprof-analyzer]="usr/bin/kprof-analyzer etc/kprof/kprof-analyzer.conf
        lib/systemd/system/kprof-analyzer.service usr/share/doc/kprof-analyzer/copyright
        usr/share/kprof/web/index.html usr/share/kprof/web/js/main.js
        usr/share/kprof/web/vendor/uplot/uPlot.esm.js usr/share/kprof/web/vendor/uplot/LICENSE"
    [kprofctl]="usr/bin/kprofctl usr/bin/kprof-analyze etc/kprof/kprofctl.conf
        usr/share/doc/kprofctl/copyright"
)
# package -> its systemd unit ("" none)
declare -A unit=([kprof-agent]=kprof-agent.service [kprof-collectord]=kprof-collectord.service
    [kprof-analyzer]=kprof-analyzer.service [kprofctl]="")

n=$(find "$tmp/out" -maxdepth 1 -name '*.deb' | wc -l)
[ "$n" = 4 ] || bad "cpack made $n packages, want 4: $(ls "$tmp/out")"
root=$tmp/root
mkdir -p "$root"
for pkg in kprof-agent kprof-collectord kprof-analyzer kprofctl; do
    deb=$tmp/out/${pkg}_${version}_${arch}.deb
    if [ ! -f "$deb" ]; then
        bad "$pkg: no ${pkg}_${version}_${arch}.deb"
        continue
    fi
    echo "$pkg: $(stat -c %s "$deb") bytes, installed $(dpkg-deb -f "$deb" Installed-Size) KiB"
    [ "$(dpkg-deb -f "$deb" Package)" = "$pkg" ] || bad "$pkg: Package field"
    dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./||' >"$tmp/$pkg.list"
    for f in ${files[$pkg]}; do
        grep -qx "$f" "$tmp/$pkg.list" || bad "$pkg: no $f"
    done
    # Nothing outside Debian's places (no /usr/local, no build paths).
    outside=$(grep -vE '^(etc/kprof/|lib/systemd/system/|usr/bin/|usr/lib/|usr/share/)' \
        "$tmp/$pkg.list" | grep -vxE '(etc|lib|lib/systemd|usr|usr/lib|usr/share)?/?' || true)
    [ -z "$outside" ] || bad "$pkg: files outside the layout: $(echo $outside)"
    grep -q local/ "$tmp/$pkg.list" && bad "$pkg: a path under local/"
    dpkg-deb -x "$deb" "$root"
    mkdir -p "$tmp/ctl/$pkg"
    dpkg-deb -e "$deb" "$tmp/ctl/$pkg"

    # Depends: every NEEDED library of every ELF file is in a package Depends names.
    depends=$(dpkg-deb -f "$deb" Depends)
    for elf in $(cd "$root" && for f in $(grep -E '^usr/(bin|lib)/' "$tmp/$pkg.list"); do
        [ -f "$f" ] && [ ! -L "$f" ] && head -c 4 "$f" | grep -q ELF && echo "$f"; done); do
        for lib in $(readelf -d "$root/$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !f { print $NF; f = 1 }')
            [ -n "$path" ] || { bad "$pkg: $elf needs $lib, not on this system"; continue; }
            # The file as dpkg knows it: its real path, or the path as found (merged /usr).
            owner=$({ dpkg -S "$(readlink -f "$path")" || dpkg -S "$path"; } 2>/dev/null |
                sed -n '1s/:.*//p' || true)
            [ -n "$owner" ] || { bad "$pkg: no Debian package owns $path"; continue; }
            case ", $depends," in
            *", $owner "* | *", $owner,"*) ;;
            *) bad "$pkg: $elf needs $lib ($owner), not in Depends: $depends" ;;
            esac
        done
    done
    echo "$pkg: Depends: $depends"

    # conffiles: exactly its settings file.
    [ "$(cat "$tmp/ctl/$pkg/conffiles" 2>/dev/null)" = "/etc/kprof/$pkg.conf" ] ||
        bad "$pkg: conffiles is '$(cat "$tmp/ctl/$pkg/conffiles" 2>/dev/null)', want /etc/kprof/$pkg.conf"

    # Maintainer scripts of the daemons: present, executable, POSIX sh that parses, naming the unit.
    if [ -n "${unit[$pkg]}" ]; then
        case $depends in *adduser*) ;; *) bad "$pkg: Depends lacks adduser (postinst)" ;; esac
        for s in postinst prerm postrm; do
            f=$tmp/ctl/$pkg/$s
            [ -x "$f" ] || { bad "$pkg: no executable $s"; continue; }
            head -n 1 "$f" | grep -qx '#!/bin/sh' || bad "$pkg: $s is not #!/bin/sh"
            sh -n "$f" || bad "$pkg: $s: sh -n failed"
            if command -v dash >/dev/null; then dash -n "$f" || bad "$pkg: $s: dash -n failed"; fi
            grep -q "@KP_" "$f" && bad "$pkg: $s has an unfilled @KP_...@"
            grep -q "'${unit[$pkg]}'" "$f" || bad "$pkg: $s does not name ${unit[$pkg]}"
        done
        grep -q "adduser --system" "$tmp/ctl/$pkg/postinst" || bad "$pkg: postinst creates no system user"
    fi
done

# The unpacked tree works: kprof-run through /usr/bin finds the library and the hook in its own
# directory, and the binaries start (stripped, linked against this system's libraries).
if [ -L "$root/usr/bin/kprof-run" ]; then
    env_out=$(env -u KPROF_INJECT_LIB "$root/usr/bin/kprof-run" --print-env -q 2>&1) ||
        bad "unpacked kprof-run --print-env failed: $env_out"
    real=$(cd "$root/$kdir" && pwd -P)
    grep -qx "export CUDA_INJECTION64_PATH='$real/libkprof_inject.so'" <<<"$env_out" ||
        bad "unpacked kprof-run did not pick $real/libkprof_inject.so: $env_out"
    grep -q "export PYTHONPATH='$real/python" <<<"$env_out" ||
        bad "unpacked kprof-run did not put $real/python on PYTHONPATH: $env_out"
    grep -qx "export KPROF_AGENT_SOCKET='/run/kprof/agent.sock'" <<<"$env_out" ||
        bad "unpacked kprof-run's socket is not /run/kprof/agent.sock: $env_out"
    "$root/usr/bin/kprof-run" --version | grep -qx "kprof-run $version" || bad "kprof-run --version"
else
    bad "usr/bin/kprof-run is not a symlink"
fi
for b in kprof-agent kprof-collectord kprof-analyzer kprofctl kprof-analyze; do
    "$root/usr/bin/$b" --help >/dev/null 2>&1 || bad "unpacked $b --help failed"
    [ "$(readelf -S "$root/usr/bin/$b" | grep -c '\.debug_info' || true)" = 0 ] || bad "$b is not stripped"
done
# The settings files parse: each daemon takes its own with --dry-run, secrets aside (the files
# they name do not exist here, so only the parse is checked: the error names a file, not a key).
for b in kprof-collectord kprof-analyzer kprof-agent; do
    out=$(env -u KPROF_PLAINTEXT -u KPROF_ALLOW_ANONYMOUS "$root/usr/bin/$b" \
        --config="$root/etc/kprof/$b.conf" --print-config 2>&1) ||
        bad "$b --print-config with the packaged $b.conf: $out"
done
# The packaged units verify against the unpacked binaries.
if command -v systemd-analyze >/dev/null; then
    for u in "$root"/lib/systemd/system/*.service; do
        sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$u" >"$tmp/$(basename "$u")"
        out=$(systemd-analyze verify "$tmp/$(basename "$u")" 2>&1) && [ -z "$out" ] ||
            bad "$(basename "$u"): $out"
    done
fi

if ! command -v lintian >/dev/null; then
    echo "SKIP: lintian not found (deploy/local/install-deps.sh installs it); the rest passed" >&2
    [ "$fail" = 0 ] && exit 77
    exit 1
fi
lint=$(lintian --tag-display-limit 0 "$tmp"/out/*.deb 2>&1 | grep -v 'running with root privileges' || true)
printf '%s\n' "$lint" | sed -n '/^[EW]:/p' | sort | uniq -c | sed 's/^/lintian: /'
if printf '%s\n' "$lint" | grep -q '^E:'; then
    bad "lintian errors"
fi
[ "$fail" = 0 ] && echo "packages OK"
exit "$fail"
