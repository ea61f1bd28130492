#!/bin/sh
# Start a RocketMQ broker or proxy of docker-compose.yml with authentication on (ACL 2.0), the
# way deploy/rocketmq/env.sh's acl_conf does for the local scripts. The mounted files hold every
# ACL setting but the one user's credentials, which must not be in the repository: this script
# copies the file to a private one, adds the credentials from the environment, and starts the
# server on the copy.
#
#   sh /etc/mqtt-bridge/rocketmq.sh broker /home/rocketmq/conf/broker.conf
#   sh /etc/mqtt-bridge/rocketmq.sh proxy /home/rocketmq/rmq-proxy.json
#
# Environment:
#   ROCKETMQ_ACL_USER      the user (AccessKey) the broker creates as a super user on its first
#                          start and signs its own requests with (registration, slave to
#                          master); the proxy signs as it too. Default rocketmq.
#   ROCKETMQ_ACL_PASSWORD  its SecretKey; required. Letters, digits, '_', '.', '-' only (it goes
#                          into a properties file and a JSON string unquoted).
#   NAMESRV                the NameServer a broker registers with, default namesrv:9876
#
# The broker keeps its users in its store (config/, RocksDB): changing the password later takes
# `mqadmin updateUser` as well as the new variable.
set -eu

die() {
    echo "rocketmq.sh: $*" >&2
    exit 2
}

[ "$#" -eq 2 ] || die "usage: rocketmq.sh broker|proxy CONFIG_FILE"
role=$1
source_file=$2
: "${ROCKETMQ_ACL_USER:=rocketmq}"
: "${ROCKETMQ_ACL_PASSWORD:?set ROCKETMQ_ACL_PASSWORD (docker-compose.yml passes MQTT_BRIDGE_ROCKETMQ_SECRET_KEY)}"
: "${NAMESRV:=namesrv:9876}"
for value in "$ROCKETMQ_ACL_USER" "$ROCKETMQ_ACL_PASSWORD"; do
    case "$value" in
        "" | *[!A-Za-z0-9_.-]*) die "ROCKETMQ_ACL_USER and ROCKETMQ_ACL_PASSWORD: letters, digits, '_', '.' or '-' only" ;;
    esac
done
[ -f "$source_file" ] || die "$source_file: no such file"

umask 077 # the copy holds the password
private=$(mktemp -d)
credentials="{\"accessKey\":\"$ROCKETMQ_ACL_USER\",\"secretKey\":\"$ROCKETMQ_ACL_PASSWORD\"}"
case "$role" in
    broker)
        grep -q '^authenticationEnabled=true' "$source_file" \
            || die "$source_file does not turn authentication on"
        conf=$private/broker.conf
        {
            cat "$source_file"
            echo
            echo "## Added by deploy/docker/rocketmq.sh from the environment."
            echo "initAuthenticationUser={\"username\":\"$ROCKETMQ_ACL_USER\",\"password\":\"$ROCKETMQ_ACL_PASSWORD\"}"
            echo "innerClientAuthenticationCredentials=$credentials"
        } >"$conf"
        exec sh mqbroker -n "$NAMESRV" -c "$conf"
        ;;
    proxy)
        grep -q '"authenticationEnabled": true' "$source_file" \
            || die "$source_file does not turn authentication on"
        [ "$(tail -n 1 "$source_file")" = "}" ] || die "$source_file must end with a line '}'"
        conf=$private/rmq-proxy.json
        escaped=$(printf '%s' "$credentials" | sed 's/"/\\"/g')
        {
            sed '$d' "$source_file"
            printf '  ,"innerClientAuthenticationCredentials": "%s"\n}\n' "$escaped"
        } >"$conf"
        exec sh mqproxy -pc "$conf"
        ;;
    *) die "role must be broker or proxy, not $role" ;;
esac
