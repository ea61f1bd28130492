#!/usr/bin/env bash
# Stop the Spark standalone cluster of DATA_DIR (started by start.sh): its workers, whose
# executors go with them, then the master, each by its recorded PID: SIGTERM, SIGKILL after
# SPARK_STOP_TIMEOUT seconds. Safe to run twice.
#   deploy/spark/stop.sh DATA_DIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 1 ] || die "usage: stop.sh DATA_DIR"
use_data_dir "$1"
names=()
for file in "$DATA_DIR"/worker-*.pid "$DATA_DIR"/master.pid; do
    [ -e "$file" ] && names+=("$(basename "$file" .pid)")
done
for name in "${names[@]}"; do
    pid=$(daemon_pid "$name")
    [ -n "$pid" ] || continue
    # The daemon leads its own session (setsid): its executors and their Python workers are
    # in it too.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + SPARK_STOP_TIMEOUT))
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.1
    done
    if alive "$pid"; then
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "spark: $name (pid $pid) stopped"
done
rm -f "$DATA_DIR"/*.pid
