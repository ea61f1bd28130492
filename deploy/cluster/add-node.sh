#!/usr/bin/env bash
# Add bridge node I to the running local cluster and to the balancer (HAProxy reloads without
# dropping a connection); the other nodes learn of it through Redis and link to it.
#   deploy/cluster/add-node.sh 4
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
i=${1:?usage: add-node.sh I}
start_node "$i"
backends=()
for dir in "$CLUSTER_DIR"/node*; do
    j=${dir##*/node}
    [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null && backends+=("127.0.0.1:$(mqtt_port "$j")")
done
"$DEPLOY/haproxy/reload.sh" "$CLUSTER_DIR/haproxy" "${backends[@]}"
