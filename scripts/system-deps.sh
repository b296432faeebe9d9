#!/usr/bin/env bash
# Debian packages used by the test suite and benchmarks, installed only if missing.
set -euo pipefail
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v npm >/dev/null || need+=(nodejs npm)
command -v prometheus >/dev/null || need+=(prometheus)
command -v openssl >/dev/null || need+=(openssl)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "missing system packages: ${need[*]} (install them with apt-get as root)" >&2
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
