#!/usr/bin/env bash
# Replace the set of bridge nodes of a running balancer without dropping a connection: writes
# a new haproxy.cfg and reloads (SIGUSR2 to the master, which starts a new worker with -sf).
# The new worker takes over the listening socket and balances new connections over the new
# node list; the old worker keeps serving the connections it has until they close. This is how
# a node joins or leaves without restarting anything else. Returns once the new worker runs.
#   deploy/haproxy/reload.sh DATA_DIR BACKEND [BACKEND...]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -ge 2 ] || die "usage: reload.sh DATA_DIR BACKEND [BACKEND...]"
use_data_dir "$1"
shift
pid=$(master_pid)
[ -n "$pid" ] || die "no balancer running in $DATA_DIR (start.sh starts one)"
bind=$(awk '$1 == "bind" { print $2; exit }' "$CFG")
write_config "$bind" "$@"

loaded() { grep -c "Loading success" "$LOG_FILE" || true; }
before=$(loaded)
kill -USR2 "$pid"
deadline=$((SECONDS + HAPROXY_START_TIMEOUT))
until [ "$(loaded)" -gt "$before" ]; do
    alive "$pid" || { log_tail; die "master (pid $pid) exited during the reload"; }
    if [ "$SECONDS" -ge "$deadline" ]; then
        log_tail
        die "no new worker after ${HAPROXY_START_TIMEOUT}s (log: $LOG_FILE)"
    fi
    sleep 0.05
done
echo "haproxy: reloaded (pid $pid): $bind -> $*"
