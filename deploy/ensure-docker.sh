#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io and docker-compose when they are
# missing (as root), and start dockerd in the background when no engine runs.
set -euo pipefail
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-compose >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "Docker is not installed; run as root or install docker.io and docker-compose" >&2
    exit 1
  fi
  echo "installing docker.io, docker-compose and debootstrap (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  echo "starting dockerd in the background (log: /tmp/kvtb-dockerd.log)"
  nohup dockerd >/tmp/kvtb-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
fi
docker info >/dev/null 2>&1 || { echo "the Docker engine did not start; see /tmp/kvtb-dockerd.log" >&2; exit 1; }
echo "Docker engine $(docker version --format '{{.Server.Version}}') is running"
