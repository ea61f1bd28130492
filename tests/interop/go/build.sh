#!/usr/bin/env bash
# Builds the Eclipse Paho Go driver into OUT_DIR (tests/interop/README.md): the modules pinned by
# go.mod and go.sum, from the default module cache (GOMODCACHE), so a warm machine needs no
# network; Go's build cache makes a rebuild after a change incremental.
set -euo pipefail

out=$(cd "${1:?usage: build.sh OUT_DIR}" && pwd)
cd "$(dirname "$0")"

# go.mod and go.sum are the lock: a build never edits them (readonly) nor lets a go.work
# elsewhere override them; no VCS stamp, so the binary depends on the sources alone.
if ! log=$(GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off go build -trimpath -o "$out/driver" . 2>&1); then
  printf '%s\n' "$log" >&2
  exit 1
fi

cat > "$out/run" <<'RUN'
#!/bin/sh
exec "$(dirname "$0")/driver"
RUN
chmod +x "$out/run"
