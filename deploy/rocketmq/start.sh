#!/usr/bin/env bash
# Start the local RocketMQ: NameServer, then one Broker registered with it. Fetches the jars
# first when the cache is empty. Idempotent: running parts are left alone. Settings: env.sh.
#   ROCKETMQ_DATA_DIR=/tmp/rmq ROCKETMQ_NAMESRV_PORT=19876 ROCKETMQ_BROKER_PORT=20911 deploy/rocketmq/start.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

"$HERE/fetch.sh" >/dev/null
need_jars
prepare_dirs
start_namesrv
start_broker
echo "rocketmq: ready: namesrv $RMQ_LOCAL_NAMESRV, broker $ROCKETMQ_BROKER_ADDR, data $ROCKETMQ_DATA_DIR"
