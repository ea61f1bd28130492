#!/usr/bin/env bash
# Builds the Paho Java driver into OUT_DIR (tests/interop/README.md): OUT_DIR/lib holds the
# driver's jar and its pinned dependencies, OUT_DIR/run starts it.
#
# Maven's output goes to a temporary folder (never target/ in the checkout) and its downloads to
# ~/.m2. The build runs offline first, so a warm ~/.m2 needs no network; a cold one falls back
# to Maven Central once.
set -euo pipefail

out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build() {
    mvn -q -B "$@" -f "$here/pom.xml" -Ddriver.build.dir="$work/build" package >"$work/log" 2>&1
}

if ! build -o && ! build; then
    cat "$work/log" >&2
    echo "build.sh: mvn package failed (log above)" >&2
    exit 1
fi

mkdir -p "$out"
mv "$work/build/lib" "$out/lib"
cat >"$out/run" <<'EOF'
#!/bin/sh
# Starts the Paho Java driver. C1 only and the serial collector: a driver lives for one test
# and several start per test, so a fast start matters more than peak speed.
exec java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -cp "$(dirname "$0")/lib/*" mqttbridge.interop.paho.Driver "$@"
EOF
chmod +x "$out/run"
