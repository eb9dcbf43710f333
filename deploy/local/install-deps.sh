#!/usr/bin/env bash
# Installs what kprof needs to build, test and run on Debian 12 (apt). Run as root, or it
# uses sudo. Safe to run again.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git
  clang libclang-rt-14-dev clang-format clang-tidy
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  python3 python3-grpcio python3-protobuf openssl
  libpq-dev postgresql postgresql-client
  libcmocka-dev librdkafka-dev zlib1g-dev
  libmicrohttpd-dev # kprof-analyzer --web-listen: the JSON HTTP API (docs/web-api.md)
  python3-confluent-kafka # it.test_kafka_sink: the producer of the Kafka path's tests
  # packaging/: the packages' checks (dpkg-shlibdeps, lintian, mmdebstrap) and the units' (systemd-analyze)
  dpkg-dev lintian systemd mmdebstrap
  umoci # deploy/image/build.sh and it.test_image: the OCI image from the .debs (mmdebstrap above)
  # it.test_helm: renders helm/kprof (Go text/template + sprig), checks it with Kubernetes' models
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev python3-kubernetes python3-jsonschema python3-yaml
  # it.test_web_ui: the web UI in Debian's headless Chromium (fonts for its screenshots),
  # driven by playwright-core from npm (tests/browser, below)
  chromium fonts-dejavu-core fonts-liberation
)
# Node.js 18 or later with npm runs the browser test's driver: Debian 12's nodejs (18) where
# the machine has no npm of its own (tests/browser pins playwright-core 1.61.1, the last
# release that runs on Node 18).
if ! command -v npm >/dev/null; then
  pkgs+=(nodejs npm)
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: run as root or install sudo" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# Debian's postgresql package may start a cluster of its own on 5432; kprof's stack and tests
# use their own data directories and ports and leave it alone.
# The browser test's driver: playwright-core at the version tests/browser/package-lock.json
# pins, from the npm registry (no browser download: it drives /usr/bin/chromium).
here=$(cd "$(dirname "$0")" && pwd)
browser=$here/../../tests/browser
if [ ! -f "$browser/node_modules/.package-lock.json" ] ||
  [ "$browser/package-lock.json" -nt "$browser/node_modules/.package-lock.json" ]; then
  echo "install-deps: npm ci in tests/browser"
  (cd "$browser" && npm ci --no-audit --no-fund --loglevel=error)
fi
