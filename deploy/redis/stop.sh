#!/usr/bin/env bash
# Stop the Redis server or Sentinel of DATA_DIR (started by start.sh / start-sentinel.sh) by its
# recorded PID: SIGTERM (a server writes out and fsyncs its AOF), SIGKILL after
# REDIS_STOP_TIMEOUT seconds. Safe to run twice.
#   deploy/redis/stop.sh DATA_DIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 1 ] || die "usage: stop.sh DATA_DIR"
use_data_dir "$1"
stop_instance TERM
