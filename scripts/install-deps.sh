#!/usr/bin/env bash
# install-deps.sh - installs the Debian 12 packages kiln builds, tests and runs with, when missing.
# Safe to run repeatedly: it only calls apt-get when something is absent.
set -euo pipefail

PKGS=(
  build-essential pkg-config
  libdnnl-dev
  libmicrohttpd-dev libjansson-dev libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  libpq-dev postgresql libfabric-dev libfabric-bin libcriterion-dev
  libopenblas-openmp-dev libopenblas0-openmp libcurl4-openssl-dev libpcre2-dev
  python3 python3-torch python3-grpcio python3-protobuf python3-requests protobuf-compiler
  libsodium-dev openssl libssl-dev
  procps iproute2 curl
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
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
