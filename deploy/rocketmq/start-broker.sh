#!/usr/bin/env bash
# Start one broker alone (the NameServer must be running), e.g. after kill-broker.sh in fault
# tests; return once it is registered. Uses the ports saved by start.sh in
# $ROCKETMQ_DATA_DIR/rocketmq.env.
#   start-broker.sh [GROUP_NAME [BROKER_ID]]
#   start-broker.sh                  # group 0's master (broker-a 0), as before
#   start-broker.sh broker-b 1       # broker-b's slave (needs RMQ_SLAVES=1)
# Any group name broker-b ... broker-z works, also beyond RMQ_GROUPS (its ports follow from its
# letter); add-group.sh starts a whole new group (master and slave).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

[ $# -le 2 ] || die "usage: start-broker.sh [GROUP_NAME [BROKER_ID]]"
need_jars
prepare_dirs
select_named_broker "${1:-$ROCKETMQ_BROKER_NAME}" "${2:-0}"
start_broker "$B_GROUP" "$B_ID"
