# shellcheck shell=bash
# Shared helpers of the Spark standalone scripts in this directory; sourced, not run.
#
# One standalone cluster (a master and its workers, all on this host) per DATA_DIR, which holds:
#   secret               the shared secret of Spark's RPC authentication (mode 600), made once
#   spark-defaults.conf  what an application needs to use this cluster (master URL, the
#                        secret, the Python of the executors); mode 600. `submit.sh` passes it
#                        to spark-submit as --properties-file
#   master.pid, worker-N.pid   PIDs of the daemons
#   master.log, worker-N.log   what they print
#   work-N/              each worker's work folder: one folder per application and executor,
#                        with the executor's stdout and stderr
#   factory-bi.zip       the `spark` and `bridge` packages as --py-files (`package.sh`)
#
# Settings (environment):
#   SPARK_BIND            127.0.0.1  address the master, the workers and their web UIs bind
#   SPARK_MASTER_UI_PORT  0          web UI port of the master (0: any free one)
#   SPARK_WORKER_CORES    2          cores each worker offers
#   SPARK_WORKER_MEMORY   2g         memory each worker offers to executors
#   SPARK_PYTHON          the venv's python if there is one, else python3: the Python of the
#                         executors, with pyspark, pyarrow and pandas installed
#   SPARK_START_TIMEOUT   90         seconds to wait for the master and for each worker
#   SPARK_STOP_TIMEOUT    10         seconds between SIGTERM and SIGKILL

: "${SPARK_BIND:=127.0.0.1}"
: "${SPARK_MASTER_UI_PORT:=0}"
: "${SPARK_WORKER_CORES:=2}"
: "${SPARK_WORKER_MEMORY:=2g}"
: "${SPARK_START_TIMEOUT:=90}"
: "${SPARK_STOP_TIMEOUT:=10}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -z "${SPARK_PYTHON:-}" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then
        SPARK_PYTHON="$REPO/.venv/bin/python"
    else
        SPARK_PYTHON="$(command -v python3)"
    fi
fi

die() {
    echo "spark: error: $*" >&2
    exit 1
}

# alive PID (deploy/process.sh): a thread of the process has not exited.
# shellcheck source-path=SCRIPTDIR source=../process.sh
. "$(dirname "${BASH_SOURCE[0]}")/../process.sh"

# use_data_dir DIR: set DATA_DIR (absolute) and the paths of the files in it.
# shellcheck disable=SC2034 # used by the scripts that source this
use_data_dir() {
    DATA_DIR="$(realpath -m "$1")"
    SECRET_FILE="$DATA_DIR/secret"
    DEFAULTS="$DATA_DIR/spark-defaults.conf"
    ZIP="$DATA_DIR/factory-bi.zip"
}

# find_spark_home: SPARK_HOME of the PySpark that SPARK_PYTHON imports (its pip package holds
# a whole Spark distribution: bin/spark-class, bin/spark-submit, jars/).
find_spark_home() {
    if [ -z "${SPARK_HOME:-}" ]; then
        SPARK_HOME="$("$SPARK_PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" \
            || die "$SPARK_PYTHON cannot import pyspark (make install-spark)"
    fi
    [ -x "$SPARK_HOME/bin/spark-class" ] || die "no bin/spark-class under SPARK_HOME=$SPARK_HOME"
    export SPARK_HOME
}

# daemon_pid NAME: the recorded PID of daemon NAME (master, worker-1, ...) if it is alive and
# still one of this DATA_DIR's (guards against a recycled PID); else nothing.
daemon_pid() {
    local pid
    pid=$(cat "$DATA_DIR/$1.pid" 2>/dev/null || true)
    if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" \
        && tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SPARK_DEPLOY_DIR=$DATA_DIR"; then
        echo "$pid"
    fi
}

# listening PORT: whether a TCP socket listens on PORT (asked of the kernel).
listening() {
    [ -n "$(ss -Hltn "sport = :$1")" ]
}

# auth_env: the environment every daemon and application of this cluster runs with. The
# secret goes in _SPARK_AUTH_SECRET (Spark reads it before spark.authenticate.secret), so it
# never shows in a process's command line.
auth_env() {
    _SPARK_AUTH_SECRET="$(cat "$SECRET_FILE")"
    export _SPARK_AUTH_SECRET SPARK_LOCAL_IP="$SPARK_BIND" SPARK_DEPLOY_DIR="$DATA_DIR"
    export PYSPARK_PYTHON="$SPARK_PYTHON"
}

log_tail() {
    [ -s "$1" ] || return 0
    echo "----- last lines of $1 -----" >&2
    tail -n 30 "$1" >&2
}
