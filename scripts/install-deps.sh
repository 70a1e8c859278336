#!/bin/sh
# Installs every Debian 12 package adtrain's build, tests and benchmarks need. Run as root
# (or with sudo). Safe to run again.
set -e
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential clang cmake pkg-config ca-certificates \
    libopenblas-dev libdnnl-dev mpich libmpich-dev libcjson-dev zlib1g-dev \
    libsqlite3-dev sqlite3 libmicrohttpd-dev libcurl4-openssl-dev \
    python3 python3-torch python3-numpy chromium >/dev/null
echo "install-deps: done"
