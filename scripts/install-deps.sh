#!/usr/bin/env bash
# Installs the Debian packages smbdirectd builds and tests against.
# Used by .ci/run and by the README's set-up command. Idempotent.
set -euo pipefail

PKGS=(
  pkg-config
  libibverbs-dev   # rdma-core verbs headers and libibverbs (verbs provider)
  librdmacm-dev    # rdma-core connection manager (verbs provider)
  libclang-dev     # bindgen, used by the rdma-sys crate
  g++              # libFuzzer's driver, built by scripts/fuzz-check.sh (fuzz/)
  ibverbs-providers
  tshark           # decodes --capture files in the tests (Debian 12: tshark 4.0)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
