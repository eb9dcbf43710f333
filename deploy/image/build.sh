#!/usr/bin/env bash
# Builds kprof's OCI image: one image for every daemon, from Debian's own tools and without a
# registry. mmdebstrap makes a minimal Debian 12 (bookworm) root filesystem and installs the
# kprof .debs into it with apt, so their Depends come from Debian's archive (this is also the
# proof that the packages install into a clean Debian 12); umoci packs it as an OCI image
# layout with its configuration (no ENTRYPOINT; CMD kprof-collectord; User kprof by uid).
#
#   deploy/image/build.sh [--debs DIR] [--out DIR] [--tag TAG] [--force]
#
#   --debs DIR   the kprof .debs (default: build/packages, which
#                `cmake --build build --target debs` writes)
#   --out DIR    where the image goes (default: build/image):
#                  DIR/kprof-oci/      the OCI image layout, tagged TAG and latest
#                  DIR/kprof-oci.tar   the same as an oci-archive (podman load, skopeo copy)
#   --tag TAG    the image's tag (default: the version of the kprof-collectord .deb)
#   --force      build even if the image of these .debs is there already
#
# The image is rebuilt only when the .debs' contents or this script change (DIR/stamp holds
# their hash). Needs root (mmdebstrap's root mode, files owned by the image's users), and
# mmdebstrap and umoci (deploy/local/install-deps.sh). mmdebstrap downloads the Debian
# packages from its default mirror; set KPROF_IMAGE_MIRROR to use another one (a URL or an
# apt sources line, as mmdebstrap takes them).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
debs="$root/build/packages"
out="$root/build/image"
tag=""
force=0

die() {
  echo "kprof-image: $*" >&2
  exit 1
}
usage() {
  echo "usage: deploy/image/build.sh [--debs DIR] [--out DIR] [--tag TAG] [--force]" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
  --debs) [ $# -ge 2 ] || usage; debs=$2; shift 2 ;;
  --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
  --tag) [ $# -ge 2 ] || usage; tag=$2; shift 2 ;;
  --force) force=1; shift ;;
  -h | --help) sed -n '2,/^set -e/p' "${BASH_SOURCE[0]}" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
  *) usage ;;
  esac
done

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap's root mode makes files owned by the image's users)"
for tool in mmdebstrap umoci dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is not installed; run deploy/local/install-deps.sh"
done
[ -d "$debs" ] || die "no directory $debs: build the packages first: cmake --build build --target debs"
debs=$(cd "$debs" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The four packages every daemon of the image comes from.
want=(kprof-collectord kprof-analyzer kprof-agent kprofctl)
files=()
for p in "${want[@]}"; do
  found=("$debs/${p}"_*.deb)
  [ -e "${found[0]}" ] || die "no ${p}_*.deb in $debs: build the packages first: cmake --build build --target debs"
  [ "${#found[@]}" -eq 1 ] || die "several ${p}_*.deb in $debs (${found[*]}); remove the old ones"
  files+=("${found[0]}")
done
version=$(dpkg-deb -f "${files[0]}" Version)
[ -n "$tag" ] || tag=${version//[^A-Za-z0-9_.-]/_}

# The stamp: what the .debs hold (their control fields and each file's content, not the
# archives' own bytes, which carry build times), this script, and the tag.
stamp_of() {
  local f tmp
  {
    sha256sum "${BASH_SOURCE[0]}"
    echo "tag=$tag mirror=${KPROF_IMAGE_MIRROR:-}"
    for f in "${files[@]}"; do
      tmp=$(mktemp -d)
      dpkg-deb -R "$f" "$tmp"
      (cd "$tmp" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum &&
        find . -type l -printf '%p -> %l\n' | LC_ALL=C sort)
      rm -rf "$tmp"
    done
  } | sha256sum | cut -d' ' -f1
}
stamp=$(stamp_of)
layout="$out/kprof-oci"
if [ "$force" = 0 ] && [ -s "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] &&
  umoci stat --image "$layout:$tag" >/dev/null 2>&1; then
  echo "kprof-image: $layout:$tag is up to date (the same .debs)"
  exit 0
fi
rm -f "$out/stamp"

work=$(mktemp -d "$out/work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The root filesystem as one tar: minbase (Debian's required packages and apt) plus the kprof
# packages with what they depend on; no documentation, manuals or locales; apt's lists and
# caches removed (mmdebstrap's cleanup). The hooks below make the directories a daemon writes to in a container (/run/kprof for the
# agent's socket and the ready files, kept while the rest of /run is emptied as mmdebstrap's
# own cleanup would) and record the user's ids.
# The kprof user and group get fixed ids (10001, outside Debian's system range, what the helm
# chart runs its pods as) before the packages come: their postinst keeps a kprof user that is
# there, so the image's numeric User is the same on every build and for securityContext.
# The .debs are reached in the chroot through mmdebstrap's file-mirror-automount hook; the
# merged-usr hook makes /usr merged the way debootstrap does, without the usrmerge package and
# the perl it would pull in; no Recommends.
kp_id=10001
incl=()
for f in "${files[@]}"; do
  incl+=(--include="$f")
done
mirror=()
if [ -n "${KPROF_IMAGE_MIRROR:-}" ]; then
  mirror=("$KPROF_IMAGE_MIRROR")
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}
echo "kprof-image: mmdebstrap bookworm with ${want[*]} $version"
mmdebstrap --mode=root --variant=minbase --format=tar \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
  --aptopt='APT::Install-Recommends "false"' \
  "${incl[@]}" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --essential-hook='echo "kprof:x:'"$kp_id"':" >>"$1/etc/group" && echo "kprof:x:'"$kp_id:$kp_id"':kprof daemons:/var/lib/kprof:/usr/sbin/nologin" >>"$1/etc/passwd"' \
  --customize-hook='chroot "$1" sh -c "install -d -o kprof -g kprof -m 0750 /var/lib/kprof /var/lib/kprof/spool && install -d -o kprof -g kprof -m 0755 /run/kprof"' \
  --customize-hook='chroot "$1" id -u kprof >"'"$work"'/uid" && chroot "$1" id -g kprof >"'"$work"'/gid"' \
  --customize-hook='rm -rf "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old' \
  --skip=cleanup/run \
  --customize-hook='for e in "$1"/run/* "$1"/run/.[!.]*; do [ ! -e "$e" ] || [ "$e" = "$1/run/kprof" ] || mountpoint -q "$e" || rm -rf "$e"; done' \
  bookworm "$work/rootfs.tar" "${mirror[@]}" >"$work/mmdebstrap.log" 2>&1 ||
  {
    tail -n 40 "$work/mmdebstrap.log" >&2
    die "mmdebstrap failed (the log above); do the .debs install on Debian 12?"
  }
uid=$(cat "$work/uid")
gid=$(cat "$work/gid")
[ "$uid:$gid" = "$kp_id:$kp_id" ] || die "the kprof user is $uid:$gid in the image, not $kp_id:$kp_id"

# The OCI layout: one layer (the root filesystem), and the configuration every daemon shares.
# No ENTRYPOINT: the command picks the daemon (CMD kprof-collectord by default).
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
rm -rf "$work/oci"
umoci init --layout "$work/oci"
umoci new --image "$work/oci:$tag"
umoci raw add-layer --image "$work/oci:$tag" --history.created="$created" \
  --history.created_by="mmdebstrap bookworm minbase + ${want[*]} $version (deploy/image/build.sh)" \
  "$work/rootfs.tar"
rm -f "$work/rootfs.tar"
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
cfg=(--clear=config.env --clear=config.cmd --clear=config.entrypoint
  --config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --config.env=LANG=C.UTF-8
  --config.user="$uid:$gid"
  --config.workingdir=/var/lib/kprof
  --config.cmd=kprof-collectord
  --config.exposedports=7070/tcp --config.exposedports=7071/tcp
  --config.exposedports=7072/tcp --config.exposedports=7073/tcp
  --config.volume=/var/lib/kprof/spool
  --config.label=org.opencontainers.image.title=kprof
  --config.label="org.opencontainers.image.description=kprof's daemons (kprof-collectord, kprof-analyzer, kprof-agent) and kprofctl on Debian 12"
  --config.label=org.opencontainers.image.version="$version"
  --config.label=org.opencontainers.image.revision="$revision"
  --config.label=org.opencontainers.image.created="$created"
  --config.label=org.opencontainers.image.base.name=debian:bookworm
  --author=kprof
  --created="$created"
  --no-history)
umoci config --image "$work/oci:$tag" "${cfg[@]}"
umoci tag --image "$work/oci:$tag" latest
umoci gc --layout "$work/oci"

rm -rf "$layout" "$out/kprof-oci.tar"
mv "$work/oci" "$layout"
tar -C "$layout" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -cf "$out/kprof-oci.tar.tmp" .
mv "$out/kprof-oci.tar.tmp" "$out/kprof-oci.tar"
echo "$stamp" >"$out/stamp"
echo "kprof-image: $layout:$tag (and :latest), $out/kprof-oci.tar; user $uid:$gid;" \
  "$(du -sh "$layout" | cut -f1) compressed"
