#!/usr/bin/env bash
# Print the state of the Redis server or Sentinel of DATA_DIR: PID, address, replication role
# (server) or the master it watches (Sentinel). Exit 0 when it runs and answers, 1 otherwise.
#   deploy/redis/status.sh DATA_DIR
# A Redis with a password or TLS needs the same access settings as its start (lib.sh); the user
# must be allowed INFO (the nodes' minimal ACL is not).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 1 ] || die "usage: status.sh DATA_DIR"
use_data_dir "$1"
load_access  # a Sentinel: REDIS_SENTINEL_PASSWORD_FILE is the password to give it
if [ -f "$DATA_DIR/sentinel.conf" ] && [ -n "${REDIS_SENTINEL_PASSWORD_FILE:-}" ]; then
    CLI_USER=""
    CLI_PASSWORD=$(read_secret "$REDIS_SENTINEL_PASSWORD_FILE" REDIS_SENTINEL_PASSWORD_FILE)
fi
pid=$(recorded_pid)
port=$(config_port)
REDIS_HOST=$(config_host)
if [ -z "$pid" ] || [ -z "$port" ]; then
    echo "stopped (data $DATA_DIR)"
    exit 1
fi
if [ -f "$DATA_DIR/sentinel.conf" ]; then
    name=$(awk '$1 == "sentinel" && $2 == "monitor" { print $3; exit }' "$DATA_DIR/sentinel.conf")
    detail="sentinel, master $name at $(cli "$port" sentinel get-master-addr-by-name "$name" | paste -sd: || true)"
else
    detail=$(cli "$port" info replication | tr -d '\r' \
        | awk -F: '$1 == "role" || $1 == "master_host" || $1 == "master_port" || $1 == "master_link_status" \
            { printf "%s%s=%s", sep, $1, $2; sep = ", " }' || true)
fi
[ -n "$detail" ] || { echo "running (pid $pid) but not answering on $REDIS_HOST:$port"; exit 1; }
echo "running, pid $pid, $REDIS_HOST:$port, $detail, data $DATA_DIR"
