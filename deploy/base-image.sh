#!/usr/bin/env bash
# Build a local base image (minimal Debian bookworm with python3, pip and venv) for machines
# that cannot pull images from a registry: debootstrap a root file system and `docker import` it.
# The host's CA bundle is copied in, so that pip inside `docker build` trusts what the host trusts.
#
# usage: deploy/base-image.sh [IMAGE_TAG]      (default kvtb-base:bookworm)
set -euo pipefail
tag=${1:-kvtb-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag already exists"
  exit 0
fi
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
root=$(mktemp -d /tmp/kvtb-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm into $root (a few minutes)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$root" "$mirror" >/tmp/kvtb-debootstrap.log 2>&1 \
  || { tail -20 /tmp/kvtb-debootstrap.log; exit 1; }
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$tag"
echo "built base image $tag"
