#!/bin/sh
# Start one Redis Sentinel in the redis image (docker-compose.yml: `sh /etc/mqtt-bridge/sentinel.sh`).
# Writes /data/sentinel.conf on the first start only: Sentinel rewrites that file with what it
# learns (its id, the epoch, the current master after a failover, the replicas and the other
# Sentinels), so a restart must keep it, or the Sentinel would watch a master that may have been
# demoted since. Delete the volume to start over. The same rule as deploy/redis/start-sentinel.sh.
#
# Environment:
#   SENTINEL_ANNOUNCE   this Sentinel's name on the network (the compose service name), which it
#                       gives the other Sentinels instead of a container IP that changes
#   MASTER_NAME         the name the bridges ask for (redis_master_name), default mqtt-bridge
#   MASTER_HOST         the initial master, default redis-master
#   MASTER_PORT         default 6379
#   QUORUM              Sentinels that must agree that the master is down, default 2 (of 3)
#   DOWN_AFTER_MS       unanswered PINGs for this long: the master is down, default 5000
#   FAILOVER_TIMEOUT_MS retry a stuck failover after this long, default 30000
#   REDIS_PASSWORD      required: the servers' password (their requirepass), which this Sentinel
#                       logs in to them with (auth-pass), and its own (requirepass: clients and
#                       the other Sentinels, which have the same one, must log in; sentinel-pass:
#                       what it logs in to them with), as deploy/redis/start-sentinel.sh writes
#                       them. Written on every start, so a changed password reaches a reused
#                       file too.
set -eu

: "${SENTINEL_ANNOUNCE:?set SENTINEL_ANNOUNCE to the service name of this Sentinel}"
: "${MASTER_NAME:=mqtt-bridge}"
: "${MASTER_HOST:=redis-master}"
: "${MASTER_PORT:=6379}"
: "${QUORUM:=2}"
: "${DOWN_AFTER_MS:=5000}"
: "${FAILOVER_TIMEOUT_MS:=30000}"
: "${REDIS_PASSWORD:?set REDIS_PASSWORD (docker-compose.yml passes MQTT_BRIDGE_REDIS_PASSWORD)}"
case "$REDIS_PASSWORD" in
    *[!A-Za-z0-9_.-]*)
        echo "sentinel.sh: REDIS_PASSWORD: letters, digits, '_', '.' or '-' only" >&2
        exit 2
        ;;
esac

conf=/data/sentinel.conf
umask 077 # the file holds the password
if [ -f "$conf" ]; then
    echo "sentinel.sh: reusing $conf (Sentinel's own state)"
    # Sentinel's rewrite may have turned requirepass into a `user default` line.
    sed -i -e '/^requirepass /d' -e '/^user default /d' -e '/^sentinel auth-pass /d' \
        -e '/^sentinel sentinel-pass /d' "$conf"
else
    # resolve-hostnames must come before `sentinel monitor` with a host name; announce-hostnames
    # makes Sentinel tell clients (the bridges) names, not container IPs.
    cat >"$conf" <<CONF
# Written by deploy/docker/sentinel.sh on the first start; Sentinel rewrites it as it learns.
port 26379
dir /data
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $SENTINEL_ANNOUNCE
sentinel monitor $MASTER_NAME $MASTER_HOST $MASTER_PORT $QUORUM
sentinel down-after-milliseconds $MASTER_NAME $DOWN_AFTER_MS
sentinel failover-timeout $MASTER_NAME $FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $MASTER_NAME 1
CONF
fi
# After `sentinel monitor`, which auth-pass names.
printf 'requirepass %s\nsentinel sentinel-pass %s\nsentinel auth-pass %s %s\n' \
    "$REDIS_PASSWORD" "$REDIS_PASSWORD" "$MASTER_NAME" "$REDIS_PASSWORD" >>"$conf"
# The image's entrypoint gives /data to the redis user and drops root before it runs the server.
exec docker-entrypoint.sh redis-server "$conf" --sentinel
