#!/usr/bin/env bash
# Start the broker alone (the NameServer must be running), e.g. after kill-broker.sh in fault
# tests. Uses the ports saved by start.sh in $ROCKETMQ_DATA_DIR/rocketmq.env.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

need_jars
prepare_dirs
start_broker
