#!/usr/bin/env bash
# Start the local RocketMQ: the NameServer, then every broker registered with it: RMQ_GROUPS
# groups (default 1: one broker, the layout of old), their masters first, then with RMQ_SLAVES=1
# one slave per group. Fetches the jars first when the cache is empty. Idempotent: running parts
# are left alone. Settings: env.sh.
#   ROCKETMQ_DATA_DIR=/tmp/rmq ROCKETMQ_NAMESRV_PORT=19876 ROCKETMQ_BROKER_PORT=20911 deploy/rocketmq/start.sh
#   RMQ_GROUPS=2 RMQ_SLAVES=1 deploy/rocketmq/start.sh   # broker-a and broker-b, a slave each
#   ROCKETMQ_ACL=1 ROCKETMQ_TLS=1 deploy/rocketmq/start.sh  # authentication on, TLS only; the
#       user and password are in $ROCKETMQ_DATA_DIR/rocketmq.env, the CA in $ROCKETMQ_DATA_DIR/tls
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

"$HERE/fetch.sh" >/dev/null
need_jars
prepare_dirs
start_namesrv
start_all_brokers
if [ "$RMQ_GROUPS" -eq 1 ] && [ "$RMQ_SLAVES" -eq 0 ]; then
    echo "rocketmq: ready: namesrv $RMQ_LOCAL_NAMESRV, broker $ROCKETMQ_BROKER_ADDR, data $ROCKETMQ_DATA_DIR"
else
    echo "rocketmq: ready: namesrv $RMQ_LOCAL_NAMESRV, $RMQ_GROUPS broker groups" \
        "($((RMQ_SLAVES + 1)) brokers each) from $ROCKETMQ_BROKER_ADDR, data $ROCKETMQ_DATA_DIR"
fi
