#!/usr/bin/env bash
# SIGKILL the broker (no shutdown hook, no flush): for fault tests. Waits until it is gone.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

[ -n "$(pid_of broker)" ] || die "no running broker recorded in $ROCKETMQ_DATA_DIR/broker.pid"
stop_role broker KILL
