#!/usr/bin/env bash
# Start HAProxy as an L4 (TCP) balancer of MQTT: clients connect to FRONTEND_PORT, each
# connection goes to the bridge node (BACKEND = HOST:PORT) with the fewest connections. Returns
# once the frontend listens. Idempotent: a running balancer is left alone (change its nodes
# with reload.sh). Config, PID, runtime socket and log in DATA_DIR; settings: lib.sh.
#   deploy/haproxy/start.sh DATA_DIR FRONTEND_PORT BACKEND [BACKEND...]
#   deploy/haproxy/start.sh /srv/haproxy 1883 127.0.0.1:11883 127.0.0.1:11884
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -ge 3 ] || die "usage: start.sh DATA_DIR FRONTEND_PORT BACKEND [BACKEND...]"
use_data_dir "$1"
port=$2
shift 2
[[ "$port" =~ ^[0-9]+$ ]] || die "not a port: '$port'"

"$HERE/../ensure-debian-packages.sh" haproxy iproute2:ss procps:ps
mkdir -p "$DATA_DIR"
pid=$(master_pid)
if [ -n "$pid" ]; then
    echo "haproxy: already running (pid $pid), data $DATA_DIR; use reload.sh to change nodes"
    exit 0
fi
! listening "$port" || die "port $port is taken by another process"
write_config "$HAPROXY_BIND:$port" "$@"

# Master-worker mode (-W): the master re-reads haproxy.cfg on SIGUSR2 and starts a new worker
# with -sf, which takes over the listening sockets; the old worker keeps its connections.
# setsid: own session, no Ctrl-C from the caller's terminal; it execs in place, so $! is the
# master.
setsid haproxy -W -f "$CFG" </dev/null >>"$LOG_FILE" 2>&1 &
pid=$!
echo "$pid" >"$PID_FILE"
deadline=$((SECONDS + HAPROXY_START_TIMEOUT))
until listening "$port"; do
    if ! alive "$pid"; then
        log_tail
        die "pid $pid exited during start-up (log: $LOG_FILE)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        "$HERE/stop.sh" "$DATA_DIR" >/dev/null
        log_tail
        die "nothing listening on $HAPROXY_BIND:$port after ${HAPROXY_START_TIMEOUT}s; stopped it"
    fi
    sleep 0.05
done
echo "haproxy: up (pid $pid) on $HAPROXY_BIND:$port -> $*, data $DATA_DIR"
