#!/usr/bin/env bash
# Start one more broker group on the running NameServer, e.g. to add a group under load: its
# master and, with RMQ_SLAVES=1, its slave; return once they are registered. NAME is broker-b ...
# broker-z (the letter fixes the ports: master ROCKETMQ_BROKER_PORT + 20 * (letter - a), slave
# + 10). The group is not added to RMQ_GROUPS: start.sh does not start it again, but stop.sh,
# status.sh, kill-broker.sh and start-broker.sh NAME ID handle it like the others.
#   RMQ_GROUPS=2 deploy/rocketmq/start.sh && deploy/rocketmq/add-group.sh broker-c
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

[ $# -eq 1 ] || die "usage: add-group.sh NAME (broker-b ... broker-z)"
need_jars
prepare_dirs
select_named_broker "$1" 0
group=$B_GROUP
start_broker "$group" 0
[ "$RMQ_SLAVES" -eq 0 ] || start_broker "$group" 1
