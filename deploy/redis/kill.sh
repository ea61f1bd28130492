#!/usr/bin/env bash
# SIGKILL the Redis server or Sentinel of DATA_DIR by its recorded PID (no shutdown, no final
# fsync: a crash, for fault tests) and wait until it is gone. Safe to run twice.
#   deploy/redis/kill.sh DATA_DIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 1 ] || die "usage: kill.sh DATA_DIR"
use_data_dir "$1"
stop_instance KILL
