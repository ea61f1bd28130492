#!/usr/bin/env bash
# Start one Redis server on REDIS_HOST:PORT (default 127.0.0.1) with its config, AOF, log and
# PID in DATA_DIR; return once it answers PING (with its data loaded). Durability is the
# append-only file alone, no RDB snapshots: a write is in the AOF (OS page cache) before it is
# acknowledged and fsynced every second, so kill -9 loses nothing acknowledged (short of a disk
# so slow that Redis postpones AOF writes, which it logs) and a power cut about the last second;
# REDIS_APPENDFSYNC=always fsyncs before every reply (slower, loses nothing). Starting again on
# the same DATA_DIR reloads the AOF. Idempotent: a running instance is left alone.
# REDIS_MIN_REPLICAS=N (default 0; give master and replica the same): as a master, refuse every
# write while fewer than N replicas are connected (min-replicas-to-write, lag at most 10 s). Set
# it to the bridges' `redis_wait_replicas`: they count a write only once N replicas confirm it
# (WAIT), and a master without replicas (one just promoted by a Sentinel failover, or a deposed
# one that woke up) would otherwise apply writes the bridges were told failed.
#   deploy/redis/start.sh DATA_DIR PORT [--replicaof HOST:PORT]
#   deploy/redis/start.sh /srv/redis-a 6379
#   deploy/redis/start.sh /srv/redis-b 6380 --replicaof 127.0.0.1:6379
#   REDIS_PASSWORD_FILE=/srv/redis.pw REDIS_USER=mqtt deploy/redis/start.sh /srv/redis-a 6379
#   REDIS_HOST=10.0.0.5 deploy/redis/start.sh /srv/redis-a 6379
# Then: status.sh, stop.sh (SIGTERM), kill.sh (SIGKILL) with the same DATA_DIR. Settings, a
# password, an ACL user, TLS and REDIS_HOST: lib.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

usage() { die "usage: start.sh DATA_DIR PORT [--replicaof HOST:PORT]"; }
[ $# -eq 2 ] || { [ $# -eq 4 ] && [ "$3" = --replicaof ]; } || usage
use_data_dir "$1"
port=$2
check_host
check_port "$port"
replicaof=""
if [ $# -eq 4 ]; then
    [[ "$4" =~ ^[^:[:space:]]+:[0-9]+$ ]] || usage
    replicaof="replicaof ${4%:*} ${4##*:}"
fi
: "${REDIS_APPENDFSYNC:=everysec}"
: "${REDIS_MIN_REPLICAS:=0}"
[[ "$REDIS_MIN_REPLICAS" =~ ^[0-9]+$ ]] || die "REDIS_MIN_REPLICAS must be a number, not '$REDIS_MIN_REPLICAS'"
case "$REDIS_APPENDFSYNC" in
    everysec | always | no) ;;
    *) die "REDIS_APPENDFSYNC must be everysec, always or no, not '$REDIS_APPENDFSYNC'" ;;
esac

load_access
require_password_off_loopback "$SERVER_PASSWORD" REDIS_PASSWORD_FILE
"$HERE/../ensure-debian-packages.sh" redis-server redis-tools:redis-cli procps:ps
mkdir -p "$DATA_DIR"
refuse_if_taken "$port"

# The password lines: requirepass of the default user, or an ACL user and the default user off;
# a replica logs in to its master with the same credentials.
access=""
if [ -n "$REDIS_USER" ]; then
    access="user default off
user $REDIS_USER on >$SERVER_PASSWORD $REDIS_USER_RULES
masteruser $REDIS_USER
masterauth $SERVER_PASSWORD"
elif [ -n "$SERVER_PASSWORD" ]; then
    access="requirepass $SERVER_PASSWORD
masterauth $SERVER_PASSWORD"
fi

# Rewritten at every start from the arguments; Sentinel may rewrite it too (CONFIG REWRITE after
# a failover), which only matters until the next start.sh.
touch "$DATA_DIR/redis.conf"
chmod 600 "$DATA_DIR/redis.conf"
cat >"$DATA_DIR/redis.conf" <<CONF
# Written by deploy/redis/start.sh.
$(net_conf)
$(tls_conf "$port")
daemonize no
dir "$DATA_DIR"
logfile "$LOG_FILE"
appendonly yes
appendfsync $REDIS_APPENDFSYNC
save ""
# A master here has one replica (the Sentinel layout): send it the data set as soon as it
# connects instead of waiting repl-diskless-sync-delay (5 s) for more replicas.
repl-diskless-sync-max-replicas 1
min-replicas-to-write $REDIS_MIN_REPLICAS
min-replicas-max-lag 10
$replicaof
$access
CONF

launch redis-server "$DATA_DIR/redis.conf"
wait_pong "$port"
echo "redis: up (pid $(recorded_pid)) on $REDIS_HOST:$port${replicaof:+, $replicaof}," \
    "appendfsync $REDIS_APPENDFSYNC${SERVER_PASSWORD:+, password${REDIS_USER:+ of user $REDIS_USER}}${TLS_ON:+, TLS}, data $DATA_DIR"
