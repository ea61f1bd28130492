#!/usr/bin/env bash
# RocketMQ's admin tool (mqadmin) against the local NameServer; `-n ROCKETMQ_HOST:PORT`
# (ROCKETMQ_NAMESRV_ADDR, env.sh) is added unless given. Exits non-zero when the tool printed an
# exception (mqadmin itself exits 0).
#   deploy/rocketmq/admin.sh updateTopic -t factory -c DefaultCluster
#   deploy/rocketmq/admin.sh clusterList
#   deploy/rocketmq/admin.sh sendMessage -t factory -p hello -c tag -k key1
#   deploy/rocketmq/admin.sh queryMsgByKey -t factory -k key1
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

need_jars
run_admin "$@"
