#!/usr/bin/env bash
# Start one Redis Sentinel on REDIS_HOST:PORT (default 127.0.0.1) that watches the master
# MASTER_NAME; return once it answers PING. Run three (QUORUM 2, the default) so that one can
# fail and the other two still agree that a master is down and elect the one that fails it over.
# Clients ask any sentinel for the current master (SENTINEL GET-MASTER-ADDR-BY-NAME MASTER_NAME).
# The other Sentinels learn it at REDIS_HOST: it talks to the master from that address.
#   deploy/redis/start-sentinel.sh DATA_DIR PORT MASTER_NAME MASTER_HOST:MASTER_PORT [QUORUM]
#   deploy/redis/start-sentinel.sh /srv/sentinel-1 26379 mqtt-bridge 127.0.0.1:6379
# Settings (only used when DATA_DIR has no sentinel.conf yet):
#   REDIS_SENTINEL_DOWN_AFTER_MS      2000   unanswered PINGs for this long: master is down
#   REDIS_SENTINEL_FAILOVER_TIMEOUT_MS 10000 retry a stuck failover after this long
#   REDIS_SENTINEL_PASSWORD_FILE      the Sentinels' own password (first line): clients and the
#                                     other Sentinels must give it (requirepass, sentinel-pass)
#   REDIS_PASSWORD_FILE, REDIS_USER   how the Sentinel logs in to the master and replicas
#                                     (sentinel auth-pass / auth-user); TLS: lib.sh
# Sentinel rewrites DATA_DIR/sentinel.conf with what it learns (its id, the epoch, the current
# master, replicas and other sentinels), so a restart on the same DATA_DIR keeps that file and
# ignores the master arguments; delete it to start over. stop.sh / kill.sh / status.sh as for
# start.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 4 ] || [ $# -eq 5 ] \
    || die "usage: start-sentinel.sh DATA_DIR PORT MASTER_NAME MASTER_HOST:MASTER_PORT [QUORUM]"
use_data_dir "$1"
port=$2
name=$3
master=$4
quorum=${5:-2}
check_host
check_port "$port"
[[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || die "master name must be [A-Za-z0-9._-]+, not '$name'"
[[ "$master" =~ ^[^:[:space:]]+:[0-9]+$ ]] || die "master must be HOST:PORT, not '$master'"
[[ "$quorum" =~ ^[1-9][0-9]*$ ]] || die "quorum must be a positive number, not '$quorum'"
: "${REDIS_SENTINEL_DOWN_AFTER_MS:=2000}"
: "${REDIS_SENTINEL_FAILOVER_TIMEOUT_MS:=10000}"

load_access
sentinel_password=""
if [ -n "${REDIS_SENTINEL_PASSWORD_FILE:-}" ]; then
    sentinel_password=$(read_secret "$REDIS_SENTINEL_PASSWORD_FILE" REDIS_SENTINEL_PASSWORD_FILE)
fi
require_password_off_loopback "$sentinel_password" REDIS_SENTINEL_PASSWORD_FILE
# wait_pong logs in to this Sentinel, not to the servers.
CLI_USER=""
CLI_PASSWORD=$sentinel_password
"$HERE/../ensure-debian-packages.sh" redis-sentinel redis-tools:redis-cli procps:ps
mkdir -p "$DATA_DIR"
# A kept sentinel.conf keeps its bind address too.
[ ! -f "$DATA_DIR/sentinel.conf" ] || REDIS_HOST=$(config_host)
refuse_if_taken "$port"

conf="$DATA_DIR/sentinel.conf"
if [ -f "$conf" ]; then
    echo "redis: reusing $conf (Sentinel's own state); delete it to monitor another master"
else
    access=""
    [ -z "$SERVER_PASSWORD" ] || access="sentinel auth-pass $name $SERVER_PASSWORD"
    [ -z "$REDIS_USER" ] || access="$access
sentinel auth-user $name $REDIS_USER"
    [ -z "$sentinel_password" ] || access="$access
requirepass $sentinel_password
sentinel sentinel-pass $sentinel_password"
    touch "$conf"
    chmod 600 "$conf"
    cat >"$conf" <<CONF
# Written by deploy/redis/start-sentinel.sh; Sentinel rewrites this file as it learns.
$(net_conf)
$(tls_conf "$port")
daemonize no
dir "$DATA_DIR"
logfile "$LOG_FILE"
sentinel monitor $name ${master%:*} ${master##*:} $quorum
sentinel down-after-milliseconds $name $REDIS_SENTINEL_DOWN_AFTER_MS
sentinel failover-timeout $name $REDIS_SENTINEL_FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $name 1
$access
CONF
fi

launch redis-sentinel "$conf"
wait_pong "$port"
echo "redis: sentinel up (pid $(recorded_pid)) on $REDIS_HOST:$port, watching $name, data $DATA_DIR"
