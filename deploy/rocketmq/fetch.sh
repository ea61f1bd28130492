#!/usr/bin/env bash
# Download the RocketMQ server jars (NameServer, Broker, Proxy, admin tools and all their
# dependencies) from Maven Central into a cache outside the repository:
#   ${ROCKETMQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mqtt-bridge/rocketmq-$ROCKETMQ_VERSION}/lib
# Does nothing when the cache is already complete (marker file written after a good copy).
# Prints the lib directory on stdout. Needs `mvn` and network access to Maven Central.
#
#   ROCKETMQ_VERSION    default 5.3.3
#   ROCKETMQ_CACHE_DIR  where lib/ goes (default above)
#   MVN                 maven command (default: mvn)
#   MVN_ARGS            extra maven arguments (e.g. "-s settings.xml" for a mirror)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"

POM="$HERE/pom.xml"
# The marker records what the cache was built from; a changed pom or version refetches.
want="version=$ROCKETMQ_VERSION pom=$(sha256sum "$POM" | cut -c1-16)"
marker="$ROCKETMQ_CACHE_DIR/.complete"

cache_ok() {
    [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] \
        && compgen -G "$ROCKETMQ_LIB/rocketmq-broker-$ROCKETMQ_VERSION.jar" >/dev/null
}

if cache_ok; then
    echo "$ROCKETMQ_LIB"
    exit 0
fi

mkdir -p "$ROCKETMQ_CACHE_DIR"
# Two test sessions may fetch at once: one downloads, the other waits for it.
exec 9>"$ROCKETMQ_CACHE_DIR/.fetch.lock"
flock -w 1800 9 || { echo "fetch.sh: timed out waiting for $ROCKETMQ_CACHE_DIR/.fetch.lock" >&2; exit 1; }
if cache_ok; then
    echo "$ROCKETMQ_LIB"
    exit 0
fi

command -v "${MVN:-mvn}" >/dev/null 2>&1 || {
    echo "fetch.sh: '${MVN:-mvn}' not found; install Maven (Debian: apt-get install maven)" >&2
    exit 1
}

tmp="$ROCKETMQ_CACHE_DIR/lib.partial"
rm -rf "$tmp"
echo "fetch.sh: downloading RocketMQ $ROCKETMQ_VERSION jars into $ROCKETMQ_LIB" >&2
start=$(date +%s)
# shellcheck disable=SC2086  # MVN_ARGS is a word list on purpose
if ! "${MVN:-mvn}" -q -B -Dstyle.color=never -f "$POM" ${MVN_ARGS:-} \
        "-Drocketmq.version=$ROCKETMQ_VERSION" \
        dependency:copy-dependencies -DincludeScope=runtime "-DoutputDirectory=$tmp" >&2; then
    rm -rf "$tmp"
    echo "fetch.sh: maven failed to fetch the RocketMQ $ROCKETMQ_VERSION jars (see above)" >&2
    exit 1
fi
if [ ! -f "$tmp/rocketmq-broker-$ROCKETMQ_VERSION.jar" ]; then
    echo "fetch.sh: maven succeeded but rocketmq-broker-$ROCKETMQ_VERSION.jar is missing in $tmp" >&2
    exit 1
fi
rm -rf "$ROCKETMQ_LIB"
mv "$tmp" "$ROCKETMQ_LIB"
echo "$want" >"$marker"
echo "fetch.sh: $(ls "$ROCKETMQ_LIB" | wc -l) jars, $(du -sh "$ROCKETMQ_LIB" | cut -f1)," \
    "$(( $(date +%s) - start )) s" >&2
echo "$ROCKETMQ_LIB"
