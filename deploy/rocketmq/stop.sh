#!/usr/bin/env bash
# Stop the local RocketMQ started by start.sh (and add-group.sh): every broker, all at once, then
# the NameServer, by their recorded PIDs. Default: SIGTERM (orderly shutdown; a broker takes
# ~20 s, mostly joining its POP revive threads), SIGKILL after ROCKETMQ_STOP_TIMEOUT seconds.
# `stop.sh --kill`: SIGKILL at once, for throw-away test instances (with SYNC_FLUSH no
# acknowledged message is lost either way). Safe to run twice.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"

sig=TERM
case "${1:-}" in
    --kill) sig=KILL ;;
    "") ;;
    *) die "usage: stop.sh [--kill]" ;;
esac
stop_brokers "$sig"
stop_role namesrv "$sig"
