#!/usr/bin/env bash
# Print the state of the local RocketMQ; exit 0 when NameServer and broker both run.
# With --cluster, also ask the NameServer for its cluster table (admin clusterList).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

rc=0
for role in namesrv broker; do
    pid=$(pid_of "$role")
    if [ "$role" = namesrv ]; then addr=$RMQ_LOCAL_NAMESRV; else addr=$ROCKETMQ_BROKER_ADDR; fi
    if [ -n "$pid" ]; then
        rss=$(awk '/^VmRSS/ {print $2 / 1024 " MiB"}' "/proc/$pid/status" 2>/dev/null || echo "?")
        echo "$role: running, pid $pid, $addr, RSS $rss"
    else
        echo "$role: stopped ($addr)"
        rc=1
    fi
done
echo "data: $ROCKETMQ_DATA_DIR ($(du -sh "$ROCKETMQ_DATA_DIR" 2>/dev/null | cut -f1))"
if [ "${1:-}" = --cluster ] && [ "$rc" = 0 ]; then
    run_admin clusterList || rc=1
fi
exit "$rc"
