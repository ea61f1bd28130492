#!/usr/bin/env bash
# Print the state of the local RocketMQ: the NameServer and every broker (those RMQ_GROUPS and
# RMQ_SLAVES ask for, and any other one running, e.g. from add-group.sh); exit 0 when all of
# them run. With --cluster, also ask the NameServer for its cluster table (admin clusterList).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

rc=0
# show ROLE LABEL ADDR [REQUIRED]: one line for a process; a missing required one fails.
show() {
    local pid rss
    pid=$(pid_of "$1")
    if [ -n "$pid" ]; then
        rss=$(awk '/^VmRSS/ {print $2 / 1024 " MiB"}' "/proc/$pid/status" 2>/dev/null || echo "?")
        echo "$2: running, pid $pid, $3, RSS $rss"
    else
        echo "$2: stopped ($3)"
        [ "${4:-1}" = 0 ] || rc=1
    fi
}

show namesrv namesrv "$RMQ_LOCAL_NAMESRV"
declare -A seen=()
while read -r i id; do
    select_broker "$i" "$id"
    seen[$B_ROLE]=1
    # Group 0's master keeps its old label "broker".
    if [ "$B_ROLE" = broker ]; then label=broker; else label="$B_ROLE"; fi
    show "$B_ROLE" "$label ($B_NAME id $B_ID, $B_BROKER_ROLE)" "$B_ADDR"
done < <(broker_list)
for role in $(recorded_broker_roles); do
    [ -z "${seen[$role]:-}" ] || continue
    select_role "$role"
    show "$B_ROLE" "$B_ROLE ($B_NAME id $B_ID, $B_BROKER_ROLE, added)" "$B_ADDR" 0
done
echo "data: $ROCKETMQ_DATA_DIR ($(du -sh "$ROCKETMQ_DATA_DIR" 2>/dev/null | cut -f1))"
if [ "${1:-}" = --cluster ] && [ "$rc" = 0 ]; then
    run_admin clusterList || rc=1
fi
exit "$rc"
