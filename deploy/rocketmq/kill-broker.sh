#!/usr/bin/env bash
# SIGKILL one broker (no shutdown hook, no flush): for fault tests. Waits until it is gone.
#   kill-broker.sh [GROUP_NAME [BROKER_ID]]   # default: group 0's master (broker-a 0)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

[ $# -le 2 ] || die "usage: kill-broker.sh [GROUP_NAME [BROKER_ID]]"
select_named_broker "${1:-$ROCKETMQ_BROKER_NAME}" "${2:-0}"
[ -n "$(pid_of "$B_ROLE")" ] || die "no running broker recorded in $ROCKETMQ_DATA_DIR/$B_ROLE.pid"
stop_role "$B_ROLE" KILL
