#!/usr/bin/env bash
# Drain and stop bridge node I: SIGTERM makes it stop accepting, close its clients (they come back
# through the balancer to the other nodes), write its sessions' state and let the survivors take
# its sessions over. Then the balancer forgets it.
#   deploy/cluster/stop-node.sh 2
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
i=${1:?usage: stop-node.sh I}
pidfile="$CLUSTER_DIR/node$i/pid"
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "cluster: node$i stopped"
fi
rm -f "$pidfile"
backends=()
for dir in "$CLUSTER_DIR"/node*; do
    j=${dir##*/node}
    [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null && backends+=("127.0.0.1:$(mqtt_port "$j")")
done
if [ ${#backends[@]} -gt 0 ]; then "$DEPLOY/haproxy/reload.sh" "$CLUSTER_DIR/haproxy" "${backends[@]}"; fi
