#!/usr/bin/env bash
# Start a local N-node cluster: Redis (registry), RocketMQ (store), N bridge nodes and HAProxy in
# front of them. Clients connect to the balancer on $CLUSTER_PORT (default 1883); node i listens
# for MQTT on 127.0.0.1:$((CLUSTER_PORT + i)) and for its peers on 127.0.0.1:$((CLUSTER_PEER_BASE + i)).
# Everything lives under $CLUSTER_DIR (default <repo>/data/cluster); stop.sh stops it all.
#   deploy/cluster/start.sh 3            # what `make cluster N=3` runs
#   RMQ_GROUPS=2 RMQ_SLAVES=1 deploy/cluster/start.sh 3   # RocketMQ: 2 groups, a slave each
#   deploy/cluster/add-node.sh 4         # one more node, no restart of the others
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

n=${1:-3}
[[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: start.sh N (number of bridge nodes)"
mkdir -p "$CLUSTER_DIR"
# Redis asks for a password generated once per cluster dir, readable by its owner only.
[ -s "$CLUSTER_REDIS_PASSWORD_FILE" ] || (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d " \n" >"$CLUSTER_REDIS_PASSWORD_FILE")
REDIS_PASSWORD_FILE="$CLUSTER_REDIS_PASSWORD_FILE" "$DEPLOY/redis/start.sh" "$CLUSTER_DIR/redis" "$CLUSTER_REDIS_PORT"
# RMQ_GROUPS / RMQ_SLAVES (and ROCKETMQ_*) pass through the environment; unset, they are 1 / 0
# or what a previous start saved in $CLUSTER_DIR/rocketmq/rocketmq.env.
ROCKETMQ_DATA_DIR="$CLUSTER_DIR/rocketmq" "$DEPLOY/rocketmq/start.sh"
backends=()
for i in $(seq 1 "$n"); do
    start_node "$i"
    backends+=("127.0.0.1:$(mqtt_port "$i")")
done
"$DEPLOY/haproxy/start.sh" "$CLUSTER_DIR/haproxy" "$CLUSTER_PORT" "${backends[@]}"
echo "$n" > "$CLUSTER_DIR/nodes"
echo "cluster: $n nodes behind 127.0.0.1:$CLUSTER_PORT (HAProxy), Redis 127.0.0.1:$CLUSTER_REDIS_PORT," \
    "RocketMQ NameServer $RMQ_NAMESRV; logs in $CLUSTER_DIR/node*/bridge.log; stop: deploy/cluster/stop.sh"
