#!/usr/bin/env bash
# Debian packages the test suite and the benchmarks use, installed only when missing.
#
# `make test` promises every suite, so this exits non-zero, naming what is
# missing, when a program is not there and cannot be installed (not root and
# no password-less sudo, or apt-get failed, or the package did not provide
# the program). Nothing else in the project installs system packages.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # mkfs.ext4 lives there; not on a user's PATH

# program -> the Debian package that provides it
declare -A package=(
  [wrk]=wrk                         # the benchmark's load generator
  [node]=nodejs                     # the conformance suite, the reference server
  [npm]=npm
  [npx]=npm
  [prometheus]=prometheus           # tests/observability
  [promtool]=prometheus
  [openssl]=openssl                 # the TLS test's certificate
  [mkfs.ext4]=e2fsprogs             # the disk-full fault test
  [java]=openjdk-17-jre-headless    # Spark
  [podman]=podman                   # the container images (make images, tests/images)
  [runc]=runc                       # podman's runtime here (crun fails on hybrid cgroups)
  [mmdebstrap]=mmdebstrap           # a Debian base image where no registry answers
  [newuidmap]=uidmap                # podman and mmdebstrap without root
  [ip]=iproute2                     # the fault tests' network namespaces and veth pairs
  [iptables]=iptables               # the fault tests' partitions
  [faketime]=faketime               # the fault tests' slow clock (libfaketime)
  [valgrind]=valgrind               # the writer's instruction counts (e2e/bench/writer_instructions.py)
)
# The long profile's too (make test-long sets LONG=1): Ceph's RADOS Gateway, the archive
# tests' second object store (testkit/ceph_rgw.py), 270 MB installed, for it alone.
if [ "${LONG:-}" = 1 ]; then
  package+=(
    [ceph-mon]=ceph-mon
    [monmaptool]=ceph-base
    [ceph-osd]=ceph-osd
    [radosgw]=radosgw
    [radosgw-admin]=ceph-common
    [ceph]=ceph-common
  )
fi

lacking() {
  local program
  for program in "${!package[@]}"; do
    command -v "$program" >/dev/null || echo "$program"
  done | sort
}

mapfile -t missing < <(lacking)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
mapfile -t need < <(for p in "${missing[@]}"; do echo "${package[$p]}"; done | sort -u)

if [ "$(id -u)" = 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "system-deps: missing ${missing[*]}; install as root: apt-get install ${need[*]}" >&2
  exit 1
fi

echo "system-deps: installing ${need[*]} (for ${missing[*]})" >&2
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

mapfile -t still < <(lacking)
if [ ${#still[@]} -ne 0 ]; then
  echo "system-deps: still missing after apt-get install: ${still[*]}" >&2
  exit 1
fi
