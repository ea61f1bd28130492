#!/usr/bin/env bash
# Stop the local cluster: every bridge node (drained, SIGTERM), HAProxy, RocketMQ and Redis.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
for dir in "$CLUSTER_DIR"/node*; do
    [ -d "$dir" ] || continue
    pid=$(cat "$dir/pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
done
for dir in "$CLUSTER_DIR"/node*; do
    pid=$(cat "$dir/pid" 2>/dev/null || true)
    [ -n "$pid" ] || continue
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/pid"
done
[ -d "$CLUSTER_DIR/haproxy" ] && "$DEPLOY/haproxy/stop.sh" "$CLUSTER_DIR/haproxy" || true
ROCKETMQ_DATA_DIR="$CLUSTER_DIR/rocketmq" "$DEPLOY/rocketmq/stop.sh" || true
[ -d "$CLUSTER_DIR/redis" ] && "$DEPLOY/redis/stop.sh" "$CLUSTER_DIR/redis" || true
echo "cluster: stopped"
