#!/usr/bin/env bash
# Stop the balancer of DATA_DIR: SIGTERM to the master, which stops every worker, including old
# ones still serving connections from before a reload; SIGKILL to all of them after
# HAPROXY_STOP_TIMEOUT seconds. Clients are disconnected. Safe to run twice.
#   deploy/haproxy/stop.sh DATA_DIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 1 ] || die "usage: stop.sh DATA_DIR"
use_data_dir "$1"
pid=$(master_pid)
if [ -z "$pid" ]; then
    rm -f "$PID_FILE"
    echo "haproxy: nothing running in $DATA_DIR"
    exit 0
fi
# shellcheck disable=SC2207  # PIDs are plain numbers
procs=("$pid" $(ps -o pid= --ppid "$pid"))
kill -TERM "$pid" 2>/dev/null || true
sig=TERM
deadline=$((SECONDS + HAPROXY_STOP_TIMEOUT))
while :; do
    left=()
    for p in "${procs[@]}"; do alive "$p" && left+=("$p"); done
    [ ${#left[@]} -gt 0 ] || break
    if [ "$sig" = TERM ] && [ "$SECONDS" -ge "$deadline" ]; then
        echo "haproxy: ${left[*]} still running after ${HAPROXY_STOP_TIMEOUT}s; SIGKILL" >&2
        sig=KILL
        kill -KILL "${left[@]}" 2>/dev/null || true
    fi
    sleep 0.05
done
rm -f "$PID_FILE"
echo "haproxy: pid $pid stopped (SIG$sig), data $DATA_DIR"
