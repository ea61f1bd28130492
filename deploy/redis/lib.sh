# shellcheck shell=bash
# Shared helpers of the Redis scripts in this directory; sourced, not run.
#
# One instance (a redis-server or a redis-sentinel) per DATA_DIR, which holds all of it:
#   redis.conf / sentinel.conf   its config (Sentinel rewrites its own as it learns)
#   redis.pid                    the PID recorded at start: stop.sh, kill.sh, status.sh use it
#   redis.log                    its log, plus anything it printed before opening the log
#   appendonlydir/               the append-only file (redis-server)
#
# Settings (environment):
#   REDIS_HOST           127.0.0.1  the IP address start.sh / start-sentinel.sh bind the
#                        instance to and reach it on; replicas and Sentinels connect from it,
#                        so it is also the address the others learn. Any other address needs
#                        a password (REDIS_PASSWORD_FILE; a Sentinel's own:
#                        REDIS_SENTINEL_PASSWORD_FILE): other hosts reach it. status.sh reads
#                        it from the config
#   REDIS_START_TIMEOUT  30  seconds to wait for PONG (AOF loading counts: a big AOF needs more)
#   REDIS_STOP_TIMEOUT   30  seconds between SIGTERM and SIGKILL
# Access (environment; start.sh and start-sentinel.sh):
#   REDIS_PASSWORD_FILE  file whose first line is the servers' password: `requirepass` of the
#                        default user, or with REDIS_USER that user's password. Replicas and
#                        Sentinels log in with it too. No whitespace, quotes or backslashes.
#   REDIS_USER           an ACL user to create (the default user is then switched off)
#   REDIS_USER_RULES     its ACL rules, default "~* &* +@all" (replicas and Sentinels log in as
#                        this user, so keep replication and INFO allowed when they are used)
#   REDIS_TLS_CERT_FILE, REDIS_TLS_KEY_FILE, REDIS_TLS_CA_FILE
#                        PEM files: PORT then speaks TLS only (no plaintext port); replication
#                        and Sentinels' links are TLS too
#   REDIS_TLS_AUTH_CLIENTS  yes (default: clients need a certificate that REDIS_TLS_CA_FILE
#                        signed), optional or no
# Config files that hold a password are written 0600.

: "${REDIS_HOST:=127.0.0.1}"
: "${REDIS_START_TIMEOUT:=30}"
: "${REDIS_STOP_TIMEOUT:=30}"

die() {
    echo "redis: error: $*" >&2
    exit 1
}

# use_data_dir DIR: set DATA_DIR (absolute) and the paths of the files in it.
use_data_dir() {
    DATA_DIR="$(realpath -m "$1")"
    PID_FILE="$DATA_DIR/redis.pid"
    LOG_FILE="$DATA_DIR/redis.log"
}

check_host() {
    [[ "$REDIS_HOST" =~ ^[0-9A-Fa-f.:]+$ ]] || die "REDIS_HOST must be an IP address, not '$REDIS_HOST'"
}

check_port() {
    if ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ] || [ "$1" -gt 65535 ]; then
        die "not a port: '$1'"
    fi
}

# alive PID (deploy/process.sh): a thread of the process has not exited.
# shellcheck source-path=SCRIPTDIR source=../process.sh
. "$(dirname "${BASH_SOURCE[0]}")/../process.sh"

# recorded_pid: print the PID in redis.pid if that process is alive and still a Redis (guards
# against a PID recycled since); else print nothing.
recorded_pid() {
    local pid
    pid=$(cat "$PID_FILE" 2>/dev/null || true)
    if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" \
        && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q redis; then
        echo "$pid"
    fi
}

# config_file: this instance's config, sentinel.conf or redis.conf.
config_file() {
    if [ -f "$DATA_DIR/sentinel.conf" ]; then echo "$DATA_DIR/sentinel.conf"; else echo "$DATA_DIR/redis.conf"; fi
}

# config_host: the address in this instance's config (its first bind address), else REDIS_HOST.
config_host() {
    local host
    host=$(awk '$1 == "bind" { print $2; exit }' "$(config_file)" 2>/dev/null || true)
    echo "${host:-$REDIS_HOST}"
}

# config_port: the port in this instance's config (its tls-port when it speaks TLS only).
config_port() {
    awk '$1 == "port" { plain = $2 } $1 == "tls-port" { tls = $2 }
        END { print (tls != "" && tls != "0") ? tls : plain }' "$(config_file)" 2>/dev/null || true
}

port_open() {
    (exec 3<>"/dev/tcp/$REDIS_HOST/$1") 2>/dev/null
}

log_tail() {
    [ -s "$LOG_FILE" ] || return 0
    echo "----- last lines of $LOG_FILE -----" >&2
    tail -n 30 "$LOG_FILE" >&2
}

# launch BINARY CONFIG: start BINARY in its own session (a Ctrl-C in the caller's terminal or
# process group does not reach it) and record its PID. setsid is not a group leader here, so it
# execs in place and $! is the server's PID. Output before the server opens its logfile (a
# config error) goes to the same file.
launch() {
    setsid "$1" "$2" </dev/null >>"$LOG_FILE" 2>&1 &
    echo $! >"$PID_FILE"
}

# read_secret FILE WHAT: print the first line of FILE, a password usable in a Redis config line.
read_secret() {
    local secret
    [ -r "$1" ] || die "$2: cannot read $1"
    secret=$(head -n 1 "$1")
    [ -n "$secret" ] || die "$2: $1 holds no password on its first line"
    [[ "$secret" =~ ^[^[:space:]\"\'\\]+$ ]] || die "$2: the password must not hold whitespace, quotes or backslashes"
    printf '%s' "$secret"
}

# load_access: read the access settings above into SERVER_PASSWORD, REDIS_USER and TLS_ON, and
# check the TLS files exist; CLI_USER / CLI_PASSWORD (what wait_pong logs in with) default to
# the servers' credentials.
load_access() {
    SERVER_PASSWORD=""
    : "${REDIS_USER:=}"
    : "${REDIS_USER_RULES:=~* &* +@all}"
    : "${REDIS_TLS_AUTH_CLIENTS:=yes}"
    if [ -n "${REDIS_PASSWORD_FILE:-}" ]; then
        SERVER_PASSWORD=$(read_secret "$REDIS_PASSWORD_FILE" REDIS_PASSWORD_FILE)
    fi
    [ -z "$REDIS_USER" ] || [ -n "$SERVER_PASSWORD" ] || die "REDIS_USER needs REDIS_PASSWORD_FILE"
    [[ "$REDIS_USER" =~ ^[A-Za-z0-9._-]*$ ]] || die "REDIS_USER must be [A-Za-z0-9._-]+"
    TLS_ON=""
    if [ -n "${REDIS_TLS_CERT_FILE:-}${REDIS_TLS_KEY_FILE:-}${REDIS_TLS_CA_FILE:-}" ]; then
        local name
        for name in REDIS_TLS_CERT_FILE REDIS_TLS_KEY_FILE REDIS_TLS_CA_FILE; do
            [ -r "${!name:-}" ] || die "$name: TLS needs all three files; cannot read '${!name:-}'"
        done
        case "$REDIS_TLS_AUTH_CLIENTS" in
            yes | optional | no) ;;
            *) die "REDIS_TLS_AUTH_CLIENTS must be yes, optional or no" ;;
        esac
        TLS_ON=1
    fi
    CLI_USER=$REDIS_USER
    CLI_PASSWORD=$SERVER_PASSWORD
}

# require_password_off_loopback PASSWORD SETTING: stop unless the instance stays on the loopback
# or clients must log in (SETTING names where the password comes from). Redis's own protected
# mode would refuse other hosts' clients without a password; with one it lets them in, and a
# Redis anyone on the network could use is what it must never be.
require_password_off_loopback() {
    [ "$REDIS_HOST" = 127.0.0.1 ] || [ -n "$1" ] \
        || die "REDIS_HOST $REDIS_HOST is reachable from other hosts: set $2"
}

# net_conf: the config line of where the instance listens (REDIS_HOST).
net_conf() {
    echo "bind $REDIS_HOST"
}

# tls_conf PORT: the config lines that make PORT a TLS-only port (nothing without TLS).
tls_conf() {
    if [ -z "$TLS_ON" ]; then
        echo "port $1"
        return
    fi
    cat <<CONF
port 0
tls-port $1
tls-cert-file "$REDIS_TLS_CERT_FILE"
tls-key-file "$REDIS_TLS_KEY_FILE"
tls-ca-cert-file "$REDIS_TLS_CA_FILE"
tls-auth-clients $REDIS_TLS_AUTH_CLIENTS
tls-replication yes
CONF
}

# cli PORT ARGS...: redis-cli on REDIS_HOST:PORT, logged in as CLI_USER/CLI_PASSWORD (through
# the environment, never the command line) and with the TLS files.
cli() {
    local port=$1 args=()
    shift
    [ -z "$CLI_USER" ] || args+=(--user "$CLI_USER")
    if [ -n "$TLS_ON" ]; then
        args+=(--tls --cacert "$REDIS_TLS_CA_FILE" --cert "$REDIS_TLS_CERT_FILE" --key "$REDIS_TLS_KEY_FILE")
    fi
    REDISCLI_AUTH="$CLI_PASSWORD" redis-cli --no-auth-warning -h "$REDIS_HOST" -p "$port" "${args[@]}" "$@"
}

# wait_pong PORT: until the launched process answers PING (a server still loading its AOF
# answers LOADING, so this also waits for the data). On failure kill it: no half-started
# instance stays behind.
wait_pong() {
    local port=$1 pid deadline=$((SECONDS + REDIS_START_TIMEOUT))
    pid=$(cat "$PID_FILE")
    until [ "$(cli "$port" ping 2>/dev/null)" = PONG ]; do
        if ! alive "$pid"; then
            log_tail
            die "pid $pid exited during start-up (log: $LOG_FILE)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null || true
            log_tail
            die "pid $pid did not answer PING on $REDIS_HOST:$port within ${REDIS_START_TIMEOUT}s; killed it"
        fi
        sleep 0.05
    done
}

# refuse_if_taken PORT: exit 0 when this DATA_DIR's instance already runs (start is idempotent);
# fail when another process holds PORT.
refuse_if_taken() {
    local pid
    pid=$(recorded_pid)
    if [ -n "$pid" ]; then
        echo "redis: already running (pid $pid) on $(config_host):$(config_port), data $DATA_DIR"
        exit 0
    fi
    ! port_open "$1" || die "port $1 is taken by another process"
}

# stop_instance SIGNAL: send SIGNAL (TERM or KILL) to the recorded process and wait until it
# is gone, escalating to SIGKILL after REDIS_STOP_TIMEOUT. Nothing running: nothing to do.
stop_instance() {
    local sig=$1 pid deadline=$((SECONDS + REDIS_STOP_TIMEOUT))
    pid=$(recorded_pid)
    if [ -z "$pid" ]; then
        rm -f "$PID_FILE"
        echo "redis: nothing running in $DATA_DIR"
        return 0
    fi
    kill "-$sig" "$pid" 2>/dev/null || true
    while alive "$pid"; do
        if [ "$sig" != KILL ] && [ "$SECONDS" -ge "$deadline" ]; then
            echo "redis: pid $pid ignored SIG$sig for ${REDIS_STOP_TIMEOUT}s; SIGKILL" >&2
            sig=KILL
            kill -KILL "$pid" 2>/dev/null || true
        fi
        sleep 0.05
    done
    rm -f "$PID_FILE"
    echo "redis: pid $pid stopped (SIG$sig), data $DATA_DIR"
}
