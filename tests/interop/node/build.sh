#!/usr/bin/env bash
# Builds the MQTT.js driver into OUT_DIR (tests/interop/README.md): the pinned packages of
# package-lock.json, installed with npm's own cache (~/.npm), so a warm machine needs no network.
set -euo pipefail

out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)

cp "$here/package.json" "$here/package-lock.json" "$here"/*.js "$out/"
# --prefer-offline: the lock pins exact versions and integrity, so a cached tarball is the one.
if ! log=$(cd "$out" && npm ci --omit=dev --no-audit --no-fund --prefer-offline 2>&1); then
  printf '%s\n' "$log" >&2
  exit 1
fi

cat > "$out/run" <<'RUN'
#!/bin/sh
exec node "$(dirname "$0")/driver.js"
RUN
chmod +x "$out/run"
