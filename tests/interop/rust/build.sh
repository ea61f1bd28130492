#!/usr/bin/env bash
# Builds the rumqttc driver into OUT_DIR (tests/interop/build.py calls this; see README.md there).
# Cargo's target folder is kept outside the checkout so a changed source rebuilds incrementally.
set -euo pipefail

out_dir="$(readlink -f "${1:?usage: build.sh OUT_DIR}")"
cd "$(dirname "$(readlink -f "$0")")"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mqtt-bridge/cargo-target/interop-rust}"
cargo build --release --locked --quiet

mkdir -p "$out_dir"
cp "$CARGO_TARGET_DIR/release/interop-rumqttc" "$out_dir/driver"
cat > "$out_dir/run" <<'RUN'
#!/bin/sh
exec "$(dirname "$(readlink -f "$0")")/driver" "$@"
RUN
chmod +x "$out_dir/run"
