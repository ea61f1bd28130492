#!/usr/bin/env bash
# Install Debian packages that are missing. Usage: ensure-debian-packages.sh PKG[:COMMAND] ...
# A package is skipped when COMMAND (default: the package name) is already on PATH.
set -euo pipefail
missing=()
for spec in "$@"; do
    pkg="${spec%%:*}"
    cmd="${spec#*:}"
    [ "$cmd" = "$spec" ] && cmd="$pkg"
    if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ]; then
        missing+=("$pkg")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
    fi
fi
echo "installing Debian packages: ${missing[*]}"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
# These packages enable a system service; tests, benchmarks and deploy/*/start.sh start their own.
for svc in mosquitto redis-server redis-sentinel haproxy prometheus; do
    if printf '%s\n' "${missing[@]}" | grep -qx "$svc"; then
        (systemctl disable --now "$svc" >/dev/null 2>&1 || service "$svc" stop >/dev/null 2>&1 || true)
    fi
done
