#!/usr/bin/env bash
# Run one of the BI jobs (spark/jobs.py: stream, backfill, show) on the standalone cluster of
# DATA_DIR with spark-submit: its properties file (master, secret, executors' Python), the
# packages as --py-files (made fresh by package.sh), Delta Lake's jars as --jars (fetched into
# the cache by fetch-delta.sh if not there), the job's arguments after the data dir.
# SUBMIT_OPTS adds spark-submit options, e.g. SUBMIT_OPTS="--executor-memory 2g".
#   deploy/spark/submit.sh DATA_DIR JOB [ARGS...]
#   deploy/spark/submit.sh /srv/spark backfill --nameserver 127.0.0.1:9876 --out /srv/bi
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -ge 2 ] || die "usage: submit.sh DATA_DIR JOB [ARGS...]"
use_data_dir "$1"
shift
[ -s "$DEFAULTS" ] || die "no $DEFAULTS: start the cluster first (deploy/spark/start.sh)"
find_spark_home
auth_env
"$HERE/package.sh" "$ZIP" >/dev/null
delta_dir="$("$HERE/fetch-delta.sh")"
jars="$(find "$delta_dir" -maxdepth 1 -name '*.jar' | sort | paste -sd, -)"
# shellcheck disable=SC2086 # SUBMIT_OPTS is a list of options
exec "$SPARK_HOME/bin/spark-submit" --properties-file "$DEFAULTS" --py-files "$ZIP" \
    --jars "$jars" ${SUBMIT_OPTS:-} "$REPO/spark/jobs.py" "$@"
