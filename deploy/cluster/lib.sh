# Shared settings and helpers of the local cluster scripts; sourced, not run.
#   CLUSTER_DIR        <repo>/data/cluster
#   CLUSTER_PORT       1883    the balancer's MQTT port; node i listens on CLUSTER_PORT + i
#   CLUSTER_PEER_BASE  18830   node i's peer links on CLUSTER_PEER_BASE + i
#   CLUSTER_REDIS_PORT 16379
#   Redis requires the password in $CLUSTER_DIR/redis.password (0600, made by start.sh)
#   PYTHON             <repo>/.venv/bin/python
#   CLUSTER_SECRET_FILE $CLUSTER_DIR/cluster.secret  the secret every node proves on its peer
#                      links; made (mode 0600) on first start, kept across restarts
#   RMQ_GROUPS, RMQ_SLAVES and the other ROCKETMQ_* settings reach deploy/rocketmq/start.sh
#   unchanged (deploy/rocketmq/env.sh): RMQ_GROUPS=2 RMQ_SLAVES=1 start.sh 3 runs two broker
#   groups with a slave each.
DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="$(cd "$DEPLOY/.." && pwd)"
: "${CLUSTER_DIR:=$REPO/data/cluster}"
CLUSTER_DIR="$(realpath -m "$CLUSTER_DIR")"
: "${CLUSTER_PORT:=1883}"
: "${CLUSTER_PEER_BASE:=18830}"
: "${CLUSTER_REDIS_PORT:=16379}"
: "${PYTHON:=$REPO/.venv/bin/python}"
RMQ_NAMESRV="127.0.0.1:${ROCKETMQ_NAMESRV_PORT:-19876}"
: "${CLUSTER_SECRET_FILE:=$CLUSTER_DIR/cluster.secret}"
CLUSTER_REDIS_PASSWORD_FILE="$CLUSTER_DIR/redis.password"

die() { echo "cluster: $*" >&2; exit 1; }
mqtt_port() { echo $((CLUSTER_PORT + $1)); }

# The cluster secret: 32 random bytes in hex, readable by this user only. Made once; every node
# (and anything else joining the cluster, such as `python -m notify`) reads the same file.
ensure_secret() {
    [ -s "$CLUSTER_SECRET_FILE" ] && return
    mkdir -p "$(dirname "$CLUSTER_SECRET_FILE")"
    (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' >"$CLUSTER_SECRET_FILE.tmp")
    mv "$CLUSTER_SECRET_FILE.tmp" "$CLUSTER_SECRET_FILE"
    echo "cluster: made the cluster secret $CLUSTER_SECRET_FILE (mode 0600)"
}

start_node() {
    local i=$1 dir="$CLUSTER_DIR/node$1"
    mkdir -p "$dir"
    ensure_secret
    if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "cluster: node$i already running (pid $(cat "$dir/pid"))"
        return
    fi
    (cd "$REPO" && exec setsid "$PYTHON" -m bridge --listen "127.0.0.1:$(mqtt_port "$i")" \
        --data-dir "$dir/data" \
        --set node_id="node$i" --set store=rocketmq --set rocketmq_namesrv="$RMQ_NAMESRV" \
        --set redis_url="redis://127.0.0.1:$CLUSTER_REDIS_PORT/0" \
        --set redis_password_file="$CLUSTER_REDIS_PASSWORD_FILE" \
        --set peer_listen="127.0.0.1:$((CLUSTER_PEER_BASE + i))" \
        --set cluster_secret_file="$CLUSTER_SECRET_FILE" \
        >>"$dir/bridge.log" 2>&1) &
    echo $! >"$dir/pid"
    local deadline=$((SECONDS + 60))
    until (exec 3<>"/dev/tcp/127.0.0.1/$(mqtt_port "$i")") 2>/dev/null; do
        kill -0 "$(cat "$dir/pid")" 2>/dev/null || { tail -n 20 "$dir/bridge.log" >&2; die "node$i exited"; }
        [ $SECONDS -lt $deadline ] || die "node$i did not listen within 60 s (see $dir/bridge.log)"
        sleep 0.2
    done
    echo "cluster: node$i up on 127.0.0.1:$(mqtt_port "$i") (pid $(cat "$dir/pid"))"
}
