#!/usr/bin/env bash
# Download Delta Lake's jars for Spark 4.2 (delta-spark and delta-storage) from Maven Central
# into a cache outside the repository, where the BI jobs' Spark session finds them
# (spark/delta.py):
#   ${DELTA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mqtt-bridge/delta-$DELTA_VERSION}
# Does nothing when the cache is already complete (marker file written after a good copy).
# Prints the directory on stdout. Needs `mvn` and network access to Maven Central.
#
#   DELTA_VERSION    default 4.4.0 (spark/delta.py's DELTA_VERSION)
#   DELTA_CACHE_DIR  where the jars go (default above)
#   MVN, MVN_ARGS    maven command and extra arguments, as for deploy/rocketmq/fetch.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${DELTA_VERSION:=4.4.0}"
: "${DELTA_CACHE_DIR:=${XDG_CACHE_HOME:-$HOME/.cache}/mqtt-bridge/delta-$DELTA_VERSION}"
POM="$HERE/delta-pom.xml"
want="version=$DELTA_VERSION pom=$(sha256sum "$POM" | cut -c1-16)"
marker="$DELTA_CACHE_DIR/.complete"

cache_ok() {
    [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] \
        && compgen -G "$DELTA_CACHE_DIR/delta-spark_*-$DELTA_VERSION.jar" >/dev/null
}

if cache_ok; then
    echo "$DELTA_CACHE_DIR"
    exit 0
fi
mkdir -p "$(dirname "$DELTA_CACHE_DIR")"
# Two test sessions may fetch at once: one downloads, the other waits for it.
exec 9>"$DELTA_CACHE_DIR.lock"
flock -w 600 9 || { echo "fetch-delta.sh: timed out waiting for $DELTA_CACHE_DIR.lock" >&2; exit 1; }
if cache_ok; then
    echo "$DELTA_CACHE_DIR"
    exit 0
fi
command -v "${MVN:-mvn}" >/dev/null 2>&1 || {
    echo "fetch-delta.sh: '${MVN:-mvn}' not found; install Maven (Debian: apt-get install maven)" >&2
    exit 1
}
tmp="$DELTA_CACHE_DIR.partial"
rm -rf "$tmp"
echo "fetch-delta.sh: downloading Delta Lake $DELTA_VERSION jars into $DELTA_CACHE_DIR" >&2
# shellcheck disable=SC2086  # MVN_ARGS is a word list on purpose
if ! "${MVN:-mvn}" -q -B -Dstyle.color=never -f "$POM" ${MVN_ARGS:-} \
        "-Ddelta.version=$DELTA_VERSION" dependency:copy-dependencies \
        -DexcludeTransitive=true "-DoutputDirectory=$tmp" >&2; then
    rm -rf "$tmp"
    echo "fetch-delta.sh: maven failed to fetch the Delta Lake $DELTA_VERSION jars (see above)" >&2
    exit 1
fi
rm -rf "$DELTA_CACHE_DIR"
mv "$tmp" "$DELTA_CACHE_DIR"
echo "$want" >"$marker"
echo "$DELTA_CACHE_DIR"
