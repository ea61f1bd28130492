#!/usr/bin/env bash
# Start a Spark standalone cluster on this host from the installed PySpark's own distribution:
# a master on MASTER_PORT and WORKERS workers (default 1), each in its own JVM; executors are
# started by the workers, each in a JVM of its own with its Python workers. Returns once every
# worker has registered with the master. RPC is authenticated with a shared secret (kept in
# DATA_DIR/secret; without it no application, worker or stranger gets an executor), the REST
# submission server is off, the web UIs cannot kill anything and bind SPARK_BIND like the rest.
# Idempotent: a running cluster is left alone. Files and settings: lib.sh.
#   deploy/spark/start.sh DATA_DIR MASTER_PORT [WORKERS]
#   deploy/spark/start.sh /srv/spark 7077 2
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    die "usage: start.sh DATA_DIR MASTER_PORT [WORKERS]"
fi
use_data_dir "$1"
port=$2
workers=${3:-1}
[[ "$port" =~ ^[0-9]+$ ]] || die "not a port: '$port'"
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || die "WORKERS must be a positive number, not '$workers'"

"$HERE/../ensure-debian-packages.sh" default-jre-headless:java iproute2:ss procps:ps
find_spark_home
mkdir -p "$DATA_DIR"
chmod 700 "$DATA_DIR"
if [ ! -s "$SECRET_FILE" ]; then
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$SECRET_FILE")
fi
auth_env
master_url="spark://$SPARK_BIND:$port"
(
    umask 077
    cat >"$DEFAULTS" <<CONF
# Written by deploy/spark/start.sh: what an application needs to run on this cluster.
#   spark-submit --properties-file $DEFAULTS --py-files $ZIP spark/jobs.py ...
spark.master                 $master_url
spark.authenticate           true
spark.authenticate.secret    $_SPARK_AUTH_SECRET
spark.pyspark.python         $SPARK_PYTHON
spark.pyspark.driver.python  $SPARK_PYTHON
spark.ui.killEnabled         false
CONF
)

daemon_opts="-Dspark.authenticate=true -Dspark.ui.killEnabled=false"
if [ -z "$(daemon_pid master)" ]; then
    ! listening "$port" || die "port $port is taken by another process"
    SPARK_MASTER_OPTS="$daemon_opts -Dspark.master.rest.enabled=false" \
        setsid "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
        --host "$SPARK_BIND" --port "$port" --webui-port "$SPARK_MASTER_UI_PORT" \
        </dev/null >>"$DATA_DIR/master.log" 2>&1 &
    launched=$!
    echo "$launched" >"$DATA_DIR/master.pid"
    deadline=$((SECONDS + SPARK_START_TIMEOUT))
    until listening "$port"; do
        # Whether the process launched is alive, not daemon_pid: until the child has exec'd,
        # its /proc environ is this script's at its own start, without SPARK_DEPLOY_DIR.
        if ! alive "$launched"; then
            log_tail "$DATA_DIR/master.log"
            die "the master exited during start-up (log: $DATA_DIR/master.log)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            "$HERE/stop.sh" "$DATA_DIR" >/dev/null
            log_tail "$DATA_DIR/master.log"
            die "the master did not listen on $SPARK_BIND:$port within ${SPARK_START_TIMEOUT}s; stopped"
        fi
        sleep 0.2
    done
fi

for n in $(seq 1 "$workers"); do
    [ -z "$(daemon_pid "worker-$n")" ] || continue
    registered=$(grep -c "Registering worker" "$DATA_DIR/master.log" || true)
    mkdir -p "$DATA_DIR/work-$n"
    SPARK_WORKER_OPTS="$daemon_opts" \
        setsid "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
        --host "$SPARK_BIND" --webui-port 0 --cores "$SPARK_WORKER_CORES" \
        --memory "$SPARK_WORKER_MEMORY" --work-dir "$DATA_DIR/work-$n" "$master_url" \
        </dev/null >>"$DATA_DIR/worker-$n.log" 2>&1 &
    launched=$!
    echo "$launched" >"$DATA_DIR/worker-$n.pid"
    deadline=$((SECONDS + SPARK_START_TIMEOUT))
    until [ "$(grep -c "Registering worker" "$DATA_DIR/master.log" || true)" -gt "$registered" ]; do
        if ! alive "$launched"; then
            log_tail "$DATA_DIR/worker-$n.log"
            die "worker $n exited during start-up (log: $DATA_DIR/worker-$n.log)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            "$HERE/stop.sh" "$DATA_DIR" >/dev/null
            log_tail "$DATA_DIR/worker-$n.log"
            die "worker $n did not register within ${SPARK_START_TIMEOUT}s; stopped the cluster"
        fi
        sleep 0.2
    done
done
echo "spark: up at $master_url with $workers worker(s) ($SPARK_WORKER_CORES cores," \
    "$SPARK_WORKER_MEMORY each), data $DATA_DIR; submit with deploy/spark/submit.sh $DATA_DIR"
