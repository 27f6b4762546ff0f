#!/usr/bin/env bash
# install-deps.sh - installs the Debian 12 packages kiln builds, tests and runs with, when missing,
# and the checkers of tools/package.json (npm ci from the committed lockfile) when tools/node_modules
# is missing or older than the lockfile. Safe to run repeatedly: it only calls apt-get and npm
# when something is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  build-essential pkg-config
  libdnnl-dev
  libmicrohttpd-dev libjansson-dev libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  libprotobuf-dev
  libpq-dev postgresql libfabric-dev libfabric-bin libcriterion-dev
  libopenblas-openmp-dev libopenblas0-openmp libcurl4-openssl-dev libpcre2-dev
  python3 python3-torch python3-grpcio python3-protobuf python3-requests protobuf-compiler
  libsodium-dev openssl libssl-dev libarchive-dev libgnutls28-dev gnutls-bin
  procps iproute2 curl
  python3-yaml python3-mypy python3-setuptools python3-wheel python3-venv python3-pip
  prometheus libsystemd-dev zsh fish
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev
  clang-14 libclang-rt-14-dev
)

# The web UI (ui/) is built with Node.js and npm (packages from ui/package-lock.json) and tested
# in Chromium. A machine with node and npm from elsewhere keeps them: Debian's npm would not
# install beside another nodejs.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
PKGS+=(chromium)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the contract, lint and schema checks; a machine that has them (any
# packaging) keeps them, one without gets Debian's.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# kubectl (for `kubectl kustomize`): any packaging; Debian's is kubernetes-client.
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# tools/: Ajv, Redocly, Spectral, pyright and the Kubernetes schemas, exactly as locked.
if [ ! -f tools/node_modules/.package-lock.json ] || [ tools/package-lock.json -nt tools/node_modules/.package-lock.json ]; then
  echo "install-deps: npm ci in tools/"
  (cd tools && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
