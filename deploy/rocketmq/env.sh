# Shared settings and helpers of the RocketMQ scripts in this directory; sourced, not run.
#
# Settings (environment variables; an explicitly set variable always wins):
#   ROCKETMQ_DATA_DIR         <repo>/data/rocketmq   store, logs, PID files, rendered configs
#   ROCKETMQ_HOST             127.0.0.1  the IP address the NameServer and brokers bind to
#                                     (but a broker's HA port: every interface) and the brokers
#                                     register with (brokerIP1, brokerIP2: what clients and slaves
#                                     connect to); the scripts reach them there. Any other
#                                     address needs ROCKETMQ_ACL=1: other hosts reach it
#   ROCKETMQ_NAMESRV_PORT     19876   NameServer (upstream default 9876)
#   ROCKETMQ_BROKER_PORT      20911   broker listenPort (upstream 10911); the broker also binds
#                                     PORT-2 (its "fast" channel) and PORT+1 (HA), keep them free
#   ROCKETMQ_CLUSTER          DefaultCluster
#   ROCKETMQ_BROKER_NAME      broker-a   brokerName of group 0
#   RMQ_GROUPS                1       broker groups (1-26) on this machine: group 0 is
#                                     ROCKETMQ_BROKER_NAME, group i>0 is broker-b, broker-c, ...;
#                                     group i's master listens on ROCKETMQ_BROKER_PORT + 20*i
#   RMQ_SLAVES                0       0, or 1: each group also gets a slave (brokerId 1, brokerRole
#                                     SLAVE) on its master's port + 10, and the masters become
#                                     SYNC_MASTER (a send is acknowledged once the slave has it)
#   ROCKETMQ_FLUSH_DISK_TYPE  SYNC_FLUSH (fsync before a send is acknowledged) | ASYNC_FLUSH
#   ROCKETMQ_TIMER            1, or 0: the brokers' timer wheel (timerWheelEnable), which the
#                             gateway's delayed publish needs; off, an idle broker takes half
#                             the CPU (0.07 of a core instead of 0.14 on two cores, 5.3.3)
#   ROCKETMQ_START_TIMEOUT    90      seconds to wait for a process to come up
#   ROCKETMQ_STOP_TIMEOUT     30      seconds between SIGTERM and SIGKILL
#   ROCKETMQ_NAMESRV_HEAP     -Xms128m -Xmx256m
#   ROCKETMQ_BROKER_HEAP      -Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m for one broker;
#                             -Xms128m -Xmx256m -XX:MaxDirectMemorySize=128m each for several
#                             (RMQ_GROUPS > 1 or RMQ_SLAVES = 1)
#   ROCKETMQ_ADMIN_HEAP       -Xms64m -Xmx256m
#   ROCKETMQ_JAVA_OPTS        extra JVM options for every process (appended last)
#   ROCKETMQ_VERSION          5.3.3
#   ROCKETMQ_CACHE_DIR        ${XDG_CACHE_HOME:-$HOME/.cache}/mqtt-bridge/rocketmq-$ROCKETMQ_VERSION
#   ROCKETMQ_NAMESRV_ADDR     $ROCKETMQ_HOST:$ROCKETMQ_NAMESRV_PORT (admin.sh against another
#                             NameServer)
#   JAVA                      java binary (default: $JAVA_HOME/bin/java, else `java`)
#   ROCKETMQ_ACL              0, or 1: brokers authenticate every request (ACL 2.0:
#                             authenticationEnabled, authorizationEnabled) and know one super
#                             user, ROCKETMQ_ACL_USER; admin.sh and probe.py sign as that user.
#                             The NameServer of 5.3.3 does not authenticate.
#   ROCKETMQ_ACL_USER         rocketmq (the AccessKey)
#   ROCKETMQ_ACL_PASSWORD     its SecretKey; default: a random one made at the first start
#                             (saved, mode 600, in $ROCKETMQ_DATA_DIR/rocketmq.env)
#   ROCKETMQ_TLS              0, or 1: NameServer and brokers speak TLS only
#                             (tls.server.mode=enforcing), with a throw-away CA and a server
#                             certificate for 127.0.0.1/localhost (and ROCKETMQ_HOST) made at
#                             the first start in $ROCKETMQ_DATA_DIR/tls/ (ca.pem is what
#                             clients trust, and client.pem/client.key a client certificate
#                             signed by it); the brokers, admin.sh and probe.py connect over
#                             TLS too
#   ROCKETMQ_TLS_MODE         enforcing | permissive (TLS and plain text both accepted)
#   ROCKETMQ_TLS_CLIENT_AUTH  0, or 1 (with ROCKETMQ_TLS=1): the servers require a client
#                             certificate signed by the CA (tls/client.pem, client.key are one)
#
# start.sh saves the ports/names it used in $ROCKETMQ_DATA_DIR/rocketmq.env; the other scripts
# read that file for every variable that is not set, so `stop.sh`, `admin.sh`,
# `start-broker.sh` ... only need ROCKETMQ_DATA_DIR to find an instance started with other ports.
#
# Brokers: one per (group, brokerId); its "role" names its files. Group 0's master keeps the
# single-broker layout (role `broker`); every other broker has role NAME-ID (broker-b-0,
# broker-a-1) and its own copies:
#   role `broker`        broker.pid  logs/broker.out  logs/broker.log       conf/broker.conf  store/
#   role e.g. broker-a-1 ROLE.pid    logs/ROLE.out    logs/ROLE/broker.log  conf/ROLE.conf    store-ROLE/
# Ports of group i (P = ROCKETMQ_BROKER_PORT): master P+20i (and P+20i-2 fast channel, P+20i+1
# HA), slave P+20i+10 (P+20i+8, P+20i+11).

ROCKETMQ_DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROCKETMQ_REPO_DIR="$(cd "$ROCKETMQ_DEPLOY_DIR/../.." && pwd)"

: "${ROCKETMQ_DATA_DIR:=$ROCKETMQ_REPO_DIR/data/rocketmq}"
ROCKETMQ_DATA_DIR="$(realpath -m "$ROCKETMQ_DATA_DIR")"
# Saved settings only fill variables that are still unset (the file uses `: ${X:=v}` lines).
if [ -f "$ROCKETMQ_DATA_DIR/rocketmq.env" ]; then
    # shellcheck disable=SC1091
    . "$ROCKETMQ_DATA_DIR/rocketmq.env"
fi

: "${ROCKETMQ_VERSION:=5.3.3}"
: "${ROCKETMQ_CACHE_DIR:=${XDG_CACHE_HOME:-$HOME/.cache}/mqtt-bridge/rocketmq-$ROCKETMQ_VERSION}"
ROCKETMQ_LIB="$ROCKETMQ_CACHE_DIR/lib"
: "${ROCKETMQ_HOST:=127.0.0.1}"
: "${ROCKETMQ_NAMESRV_PORT:=19876}"
: "${ROCKETMQ_BROKER_PORT:=20911}"
: "${ROCKETMQ_CLUSTER:=DefaultCluster}"
: "${ROCKETMQ_BROKER_NAME:=broker-a}"
: "${RMQ_GROUPS:=1}"
: "${RMQ_SLAVES:=0}"
: "${ROCKETMQ_FLUSH_DISK_TYPE:=SYNC_FLUSH}"
: "${ROCKETMQ_TIMER:=1}"
: "${ROCKETMQ_START_TIMEOUT:=90}"
: "${ROCKETMQ_STOP_TIMEOUT:=30}"
: "${ROCKETMQ_NAMESRV_HEAP:=-Xms128m -Xmx256m}"
: "${ROCKETMQ_ACL:=0}"
: "${ROCKETMQ_ACL_USER:=rocketmq}"
: "${ROCKETMQ_TLS:=0}"
: "${ROCKETMQ_TLS_MODE:=enforcing}"
: "${ROCKETMQ_TLS_CLIENT_AUTH:=0}"
for v in ROCKETMQ_ACL ROCKETMQ_TLS ROCKETMQ_TLS_CLIENT_AUTH; do
    case "${!v}" in
        0 | 1) ;;
        *) echo "$v must be 0 or 1, not '${!v}'" >&2; exit 2 ;;
    esac
done
case "$ROCKETMQ_HOST" in
    "" | *[!0-9A-Fa-f.:]*) echo "ROCKETMQ_HOST must be an IP address, not '$ROCKETMQ_HOST'" >&2; exit 2 ;;
esac
# Brokers other hosts reach must authenticate who writes and reads (the NameServer only lists
# routes; RocketMQ has no login for it).
if [ "$ROCKETMQ_HOST" != 127.0.0.1 ] && [ "$ROCKETMQ_ACL" != 1 ]; then
    echo "ROCKETMQ_HOST $ROCKETMQ_HOST is reachable from other hosts: set ROCKETMQ_ACL=1" >&2
    exit 2
fi
case "$ROCKETMQ_TLS_MODE" in
    enforcing | permissive) ;;
    *) echo "ROCKETMQ_TLS_MODE must be enforcing or permissive, not '$ROCKETMQ_TLS_MODE'" >&2; exit 2 ;;
esac
case "$ROCKETMQ_ACL_USER" in
    "" | *[!A-Za-z0-9_.-]*) echo "ROCKETMQ_ACL_USER must be letters, digits, '_', '.' or '-'" >&2; exit 2 ;;
esac
RMQ_TLS_DIR="$ROCKETMQ_DATA_DIR/tls"
if ! [[ "$RMQ_GROUPS" =~ ^[1-9][0-9]?$ ]] || [ "$RMQ_GROUPS" -gt 26 ]; then
    echo "RMQ_GROUPS must be 1..26, not '$RMQ_GROUPS'" >&2
    exit 2
fi
case "$RMQ_SLAVES" in
    0 | 1) ;;
    *) echo "RMQ_SLAVES must be 0 or 1, not '$RMQ_SLAVES'" >&2; exit 2 ;;
esac
# Several brokers on one machine: smaller heaps each, unless set.
if [ "$RMQ_GROUPS" -gt 1 ] || [ "$RMQ_SLAVES" -gt 0 ]; then
    : "${ROCKETMQ_BROKER_HEAP:=-Xms128m -Xmx256m -XX:MaxDirectMemorySize=128m}"
fi
: "${ROCKETMQ_BROKER_HEAP:=-Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m}"
: "${ROCKETMQ_ADMIN_HEAP:=-Xms64m -Xmx256m}"
: "${ROCKETMQ_JAVA_OPTS:=}"
# admin.sh can also talk to another NameServer: ROCKETMQ_NAMESRV_ADDR=host:port admin.sh ...
: "${ROCKETMQ_NAMESRV_ADDR:=$ROCKETMQ_HOST:$ROCKETMQ_NAMESRV_PORT}"
RMQ_LOCAL_NAMESRV="$ROCKETMQ_HOST:$ROCKETMQ_NAMESRV_PORT"  # what start*.sh start and register with
# shellcheck disable=SC2034  # group 0's master, for the scripts that source this file
ROCKETMQ_BROKER_ADDR="$ROCKETMQ_HOST:$ROCKETMQ_BROKER_PORT"

case "$ROCKETMQ_FLUSH_DISK_TYPE" in
    SYNC_FLUSH | ASYNC_FLUSH) ;;
    *) echo "ROCKETMQ_FLUSH_DISK_TYPE must be SYNC_FLUSH or ASYNC_FLUSH, not '$ROCKETMQ_FLUSH_DISK_TYPE'" >&2; exit 2 ;;
esac
case "$ROCKETMQ_TIMER" in
    1) RMQ_TIMER_WHEEL=true ;;
    0) RMQ_TIMER_WHEEL=false ;;
    *) echo "ROCKETMQ_TIMER must be 1 or 0, not '$ROCKETMQ_TIMER'" >&2; exit 2 ;;
esac

if [ -z "${JAVA:-}" ]; then
    if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then JAVA="$JAVA_HOME/bin/java"; else JAVA=java; fi
fi

# Layout of the data dir.
RMQ_HOME="$ROCKETMQ_DATA_DIR/home"  # rocketmq.home.dir and user.home of every JVM (conf/ inside)
RMQ_CONF="$ROCKETMQ_DATA_DIR/conf"  # rendered namesrv.conf / broker.conf / ROLE.conf
RMQ_LOGS="$ROCKETMQ_DATA_DIR/logs"
RMQ_STORE="$ROCKETMQ_DATA_DIR/store"  # group 0's master; the other brokers: store-ROLE

NAMESRV_MAIN=org.apache.rocketmq.namesrv.NamesrvStartup
BROKER_MAIN=org.apache.rocketmq.broker.BrokerStartup
ADMIN_MAIN=org.apache.rocketmq.tools.command.MQAdminStartup

# JDK 9+ module access RocketMQ's store and Netty need: the store casts mapped buffers to
# sun.nio.ch.DirectBuffer and reflects into java.nio; Netty frees direct memory via internals.
RMQ_JDK_ACCESS=(
    --add-exports=java.base/sun.nio.ch=ALL-UNNAMED
    --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
    --add-opens=java.base/java.nio=ALL-UNNAMED
    --add-opens=java.base/java.lang=ALL-UNNAMED
    --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
    --add-opens=java.base/java.util=ALL-UNNAMED
    --add-opens=java.base/jdk.internal.misc=ALL-UNNAMED
    --add-exports=java.base/jdk.internal.misc=ALL-UNNAMED
    --add-opens=java.base/java.io=ALL-UNNAMED
    --add-opens=java.base/java.net=ALL-UNNAMED
)

# Options of every RocketMQ JVM. SerialGC: heaps are small and the machine may have 2 shared
# cores. The servers keep the full JIT: an idle broker spends most of its CPU comparing its timer
# wheel (16 MiB for the 3-day maximum delay) with its file every second, and C1-only code took
# 0.2 of a core for that where C2 code takes 0.05, for the same start-up CPU (measured on 5.3.3).
# mqadmin runs for a second or two, so it stops at C1 (TieredStopAtLevel=1), which starts faster.
rmq_java_common() {
    # $1 = logback file name under $RMQ_HOME/conf, $2 = its log dir (default $RMQ_LOGS)
    # shellcheck disable=SC2206  # heap/opts strings are word lists on purpose
    RMQ_JAVA_ARGS=(
        -server -XX:+UseSerialGC -XX:-OmitStackTraceInFastThrow
        -XX:-UseLargePages -Xss512k -XX:MaxMetaspaceSize=256m
        "${RMQ_JDK_ACCESS[@]}"
        -Djava.awt.headless=true -Dfile.encoding=UTF-8
        "-Duser.home=$RMQ_HOME" "-Drocketmq.home.dir=$RMQ_HOME"
        "-Drmq.log.dir=${2:-$RMQ_LOGS}"
        "-Drmq.logback.configurationFile=$RMQ_HOME/conf/$1"
        -Drocketmq.client.logUseSlf4j=true
        -cp "$ROCKETMQ_LIB/*"
    )
    if [ "$ROCKETMQ_TLS" = 1 ]; then
        # TlsSystemConfig (5.3.3): the server side of NameServer and broker, and (tls.enable)
        # the client side of the broker's registration and of mqadmin, which checks the
        # server's certificate against our CA. No tls.properties: a file at the default path
        # (/etc/rocketmq/tls.properties) would override these.
        RMQ_JAVA_ARGS+=(
            "-Dtls.server.mode=$ROCKETMQ_TLS_MODE" -Dtls.enable=true -Dtls.test.mode.enable=false
            "-Dtls.config.file=$RMQ_TLS_DIR/no-tls.properties"
            "-Dtls.server.certPath=$RMQ_TLS_DIR/server.pem"
            "-Dtls.server.keyPath=$RMQ_TLS_DIR/server.key"
            -Dtls.client.authServer=true "-Dtls.client.trustCertPath=$RMQ_TLS_DIR/ca.pem"
        )
        if [ "$ROCKETMQ_TLS_CLIENT_AUTH" = 1 ]; then
            # Servers ask for a certificate signed by our CA; the JVMs' own clients show one.
            RMQ_JAVA_ARGS+=(
                -Dtls.server.need.client.auth=require -Dtls.server.authClient=true
                "-Dtls.server.trustCertPath=$RMQ_TLS_DIR/ca.pem"
                "-Dtls.client.certPath=$RMQ_TLS_DIR/client.pem"
                "-Dtls.client.keyPath=$RMQ_TLS_DIR/client.key"
            )
        else
            RMQ_JAVA_ARGS+=(-Dtls.server.need.client.auth=none)
        fi
    fi
}

# make_tls_files: a throw-away CA and a server certificate (127.0.0.1, localhost, ROCKETMQ_HOST)
# signed by it, made once per data dir. Netty reads the server key only as PKCS#8 PEM (genpkey's
# format).
make_tls_files() {
    [ "$ROCKETMQ_TLS" = 1 ] || return 0
    [ -s "$RMQ_TLS_DIR/server.pem" ] && return 0
    command -v openssl >/dev/null || die "ROCKETMQ_TLS=1 needs openssl to make its certificates"
    local san=""
    [ "$ROCKETMQ_HOST" = 127.0.0.1 ] || san=",IP:$ROCKETMQ_HOST"
    mkdir -p "$RMQ_TLS_DIR"
    chmod 700 "$RMQ_TLS_DIR"
    (
        cd "$RMQ_TLS_DIR"
        openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out ca.key 2>/dev/null
        openssl req -x509 -new -key ca.key -days 30 -subj "/CN=mqtt-bridge test RocketMQ CA" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -out ca.pem 2>/dev/null
        openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out server.key 2>/dev/null
        openssl req -new -key server.key -subj "/CN=$ROCKETMQ_HOST" -out server.csr 2>/dev/null
        printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost$san" >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile server.ext -out server.pem 2>/dev/null
        openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out client.key 2>/dev/null
        openssl req -new -key client.key -subj "/CN=mqtt-bridge test client" -out client.csr 2>/dev/null
        printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=clientAuth" >client.ext
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile client.ext -out client.pem 2>/dev/null
        rm -f server.csr server.ext client.csr client.ext ca.srl
    ) || die "making the TLS files in $RMQ_TLS_DIR failed"
}

# acl_conf: the broker settings of ROCKETMQ_ACL=1 (AuthConfig keys, 5.3.3), appended to a
# rendered broker conf. The user is created as a SUPER user on the broker's first start (in its
# store's config/users RocksDB) and is also what the broker's own client (registration,
# slave to master) signs with.
acl_conf() {
    [ "$ROCKETMQ_ACL" = 1 ] || return 0
    cat <<CONF

## Authentication and authorization (ROCKETMQ_ACL=1, written by deploy/rocketmq/env.sh).
authenticationEnabled=true
authenticationProvider=org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider
authenticationMetadataProvider=org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider
initAuthenticationUser={"username":"$ROCKETMQ_ACL_USER","password":"$ROCKETMQ_ACL_PASSWORD"}
innerClientAuthenticationCredentials={"accessKey":"$ROCKETMQ_ACL_USER","secretKey":"$ROCKETMQ_ACL_PASSWORD"}
authorizationEnabled=true
authorizationProvider=org.apache.rocketmq.auth.authorization.provider.DefaultAuthorizationProvider
authorizationMetadataProvider=org.apache.rocketmq.auth.authorization.provider.LocalAuthorizationMetadataProvider
CONF
}

die() {
    echo "rocketmq: error: $*" >&2
    exit 1
}

need_jars() {
    compgen -G "$ROCKETMQ_LIB/rocketmq-broker-*.jar" >/dev/null \
        || die "RocketMQ jars missing in $ROCKETMQ_LIB; run deploy/rocketmq/fetch.sh"
}

# Copy the static config (logback) into the home dir RocketMQ expects, render the templates.
prepare_dirs() {
    mkdir -p "$RMQ_HOME/conf" "$RMQ_CONF" "$RMQ_LOGS" "$RMQ_STORE" "$ROCKETMQ_DATA_DIR/namesrv"
    cp "$ROCKETMQ_DEPLOY_DIR"/logback/*.xml "$RMQ_HOME/conf/"
    if [ "$ROCKETMQ_ACL" = 1 ] && [ -z "${ROCKETMQ_ACL_PASSWORD:-}" ]; then
        ROCKETMQ_ACL_PASSWORD=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
    fi
    : "${ROCKETMQ_ACL_PASSWORD:=}"
    case "$ROCKETMQ_ACL_PASSWORD" in
        *[\"\\]* | *[[:space:]]*) die "ROCKETMQ_ACL_PASSWORD must not hold quotes, backslashes or spaces" ;;
    esac
    make_tls_files
    (
        umask 077  # the ACL password is in it
        {
            echo "# Written by deploy/rocketmq/start.sh; read by the other scripts for unset variables."
            for v in ROCKETMQ_HOST ROCKETMQ_NAMESRV_PORT ROCKETMQ_BROKER_PORT ROCKETMQ_CLUSTER \
                ROCKETMQ_BROKER_NAME RMQ_GROUPS RMQ_SLAVES ROCKETMQ_FLUSH_DISK_TYPE ROCKETMQ_TIMER \
                ROCKETMQ_VERSION ROCKETMQ_ACL ROCKETMQ_ACL_USER ROCKETMQ_ACL_PASSWORD ROCKETMQ_TLS \
                ROCKETMQ_TLS_MODE ROCKETMQ_TLS_CLIENT_AUTH; do
                printf ': "${%s:=%s}"\n' "$v" "${!v}"
            done
        } >"$ROCKETMQ_DATA_DIR/rocketmq.env.tmp"
        mv "$ROCKETMQ_DATA_DIR/rocketmq.env.tmp" "$ROCKETMQ_DATA_DIR/rocketmq.env"
    )
}

# probe_env: what probe.py needs to reach a secured instance (TLS CA, ACL user), as env vars.
probe_env() {
    local vars=()
    [ "$ROCKETMQ_TLS" = 1 ] && vars+=("ROCKETMQ_PROBE_CAFILE=$RMQ_TLS_DIR/ca.pem")
    if [ "$ROCKETMQ_TLS" = 1 ] && [ "$ROCKETMQ_TLS_CLIENT_AUTH" = 1 ]; then
        vars+=("ROCKETMQ_PROBE_CERTFILE=$RMQ_TLS_DIR/client.pem" "ROCKETMQ_PROBE_KEYFILE=$RMQ_TLS_DIR/client.key")
    fi
    if [ "$ROCKETMQ_ACL" = 1 ]; then
        vars+=("ROCKETMQ_PROBE_ACCESS_KEY=$ROCKETMQ_ACL_USER" "ROCKETMQ_PROBE_SECRET_KEY=$ROCKETMQ_ACL_PASSWORD")
    fi
    [ "${#vars[@]}" -eq 0 ] || printf '%s\n' "${vars[@]}"
}

# render TEMPLATE OUTPUT: replace @NAME@ placeholders; the broker ones come from the B_*
# variables of select_broker.
render() {
    sed -e "s#@DATA_DIR@#$ROCKETMQ_DATA_DIR#g" \
        -e "s#@HOST@#$ROCKETMQ_HOST#g" \
        -e "s#@NAMESRV_PORT@#$ROCKETMQ_NAMESRV_PORT#g" \
        -e "s#@CLUSTER@#$ROCKETMQ_CLUSTER#g" \
        -e "s#@FLUSH_DISK_TYPE@#$ROCKETMQ_FLUSH_DISK_TYPE#g" \
        -e "s#@TIMER_WHEEL@#$RMQ_TIMER_WHEEL#g" \
        -e "s#@STORE_DIR@#${B_STORE:-$RMQ_STORE}#g" \
        -e "s#@BROKER_PORT@#${B_PORT:-$ROCKETMQ_BROKER_PORT}#g" \
        -e "s#@HA_PORT@#${B_HA_PORT:-$((ROCKETMQ_BROKER_PORT + 1))}#g" \
        -e "s#@BROKER_NAME@#${B_NAME:-$ROCKETMQ_BROKER_NAME}#g" \
        -e "s#@BROKER_ID@#${B_ID:-0}#g" \
        -e "s#@BROKER_ROLE@#${B_BROKER_ROLE:-ASYNC_MASTER}#g" \
        -e "s#@IN_SYNC_REPLICAS@#${B_IN_SYNC_REPLICAS:-1}#g" \
        "$1" >"$2.tmp"
    mv "$2.tmp" "$2"
}

# -- brokers: (group index, brokerId) -> name, role, ports, files -----------------------------
RMQ_LETTERS=abcdefghijklmnopqrstuvwxyz

# group_name INDEX: brokerName of group INDEX (0-based): ROCKETMQ_BROKER_NAME, broker-b, ...
group_name() {
    if [ "$1" -eq 0 ]; then echo "$ROCKETMQ_BROKER_NAME"; else echo "broker-${RMQ_LETTERS:$1:1}"; fi
}

# group_index NAME: print the index of group NAME; fail for a name no group has.
group_index() {
    local i
    for ((i = 0; i < ${#RMQ_LETTERS}; i++)); do
        if [ "$(group_name "$i")" = "$1" ]; then
            echo "$i"
            return 0
        fi
    done
    return 1
}

# select_broker INDEX ID: set the B_* variables of the broker with brokerId ID (0 master,
# 1 slave) in group INDEX: B_NAME (brokerName), B_ROLE (file names), B_PORT, B_HA_PORT, B_ADDR,
# B_BROKER_ROLE (brokerRole), B_IN_SYNC_REPLICAS, B_STORE, B_CONF, B_OUT, B_LOG_DIR.
select_broker() {
    local i=$1 id=$2
    # shellcheck disable=SC2034  # B_GROUP is for the scripts that source this file
    B_GROUP=$i
    B_ID=$id
    B_NAME=$(group_name "$i")
    if [ "$i" -gt 0 ] && [ "$B_NAME" = "$ROCKETMQ_BROKER_NAME" ]; then
        die "group $i would be named $B_NAME like group 0 (ROCKETMQ_BROKER_NAME); choose another name"
    fi
    B_PORT=$((ROCKETMQ_BROKER_PORT + 20 * i + 10 * id))
    B_HA_PORT=$((B_PORT + 1))
    B_ADDR="$ROCKETMQ_HOST:$B_PORT"
    if [ "$i" -eq 0 ] && [ "$id" -eq 0 ]; then
        B_ROLE=broker  # the single-broker layout of old
        B_STORE=$RMQ_STORE
        B_LOG_DIR=$RMQ_LOGS
    else
        B_ROLE="$B_NAME-$id"
        B_STORE="$ROCKETMQ_DATA_DIR/store-$B_ROLE"
        B_LOG_DIR="$RMQ_LOGS/$B_ROLE"
    fi
    B_CONF="$RMQ_CONF/$B_ROLE.conf"
    B_OUT="$RMQ_LOGS/$B_ROLE.out"
    if [ "$id" -ne 0 ]; then
        B_BROKER_ROLE=SLAVE
    elif [ "$RMQ_SLAVES" -gt 0 ]; then
        B_BROKER_ROLE=SYNC_MASTER
    else
        B_BROKER_ROLE=ASYNC_MASTER
    fi
    # Copies (master included) that must have a message before a SYNC_MASTER acknowledges it.
    B_IN_SYNC_REPLICAS=$((RMQ_SLAVES + 1))
}

# select_named_broker GROUP_NAME ID: select_broker by group name; dies for an unknown group or id.
select_named_broker() {
    local i
    i=$(group_index "$1") \
        || die "no broker group '$1': group 0 is $ROCKETMQ_BROKER_NAME, the others broker-b ... broker-z"
    case "$2" in
        0) ;;
        1) [ "$RMQ_SLAVES" -gt 0 ] || die "broker id 1 is a slave; slaves need RMQ_SLAVES=1" ;;
        *) die "broker id must be 0 (master) or 1 (slave), not '$2'" ;;
    esac
    select_broker "$i" "$2"
}

# select_role ROLE: select_broker for a role name (broker, GROUP_NAME-ID).
select_role() {
    if [ "$1" = broker ]; then select_broker 0 0; else select_named_broker "${1%-*}" "${1##*-}"; fi
}

# broker_list: "INDEX ID" of every broker RMQ_GROUPS and RMQ_SLAVES ask for, masters first.
broker_list() {
    local i id
    for ((id = 0; id <= RMQ_SLAVES; id++)); do
        for ((i = 0; i < RMQ_GROUPS; i++)); do echo "$i $id"; done
    done
}

# recorded_broker_roles: roles of the brokers with a PID file (started by any script here).
recorded_broker_roles() {
    local f role
    for f in "$ROCKETMQ_DATA_DIR"/*.pid; do
        [ -e "$f" ] || continue
        role=$(basename "$f" .pid)
        [ "$role" = namesrv ] || echo "$role"
    done
}

# pid_of ROLE: print the PID recorded for ROLE (namesrv, broker, broker-b-0, ...) if that process
# is alive and still runs the expected main class (guards against a recycled PID); else print
# nothing.
pid_of() {
    local role=$1 main pid
    case "$role" in "") return 1 ;; namesrv) main=$NAMESRV_MAIN ;; *) main=$BROKER_MAIN ;; esac
    [ -f "$ROCKETMQ_DATA_DIR/$role.pid" ] || return 0
    pid=$(cat "$ROCKETMQ_DATA_DIR/$role.pid" 2>/dev/null || true)
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$main"; then
        echo "$pid"
    fi
}

port_open() {
    (exec 3<>"/dev/tcp/$ROCKETMQ_HOST/$1") 2>/dev/null
}

log_tail() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || continue
        echo "----- last lines of $f -----" >&2
        tail -n 40 "$f" >&2
    done
}

# launch ROLE MAIN ARGS...: start a detached JVM (own session, so a terminal's Ctrl-C or the
# caller's process group does not reach it), record its PID.
launch() {
    local role=$1 main=$2 out="$RMQ_LOGS/$1.out"
    shift 2
    [ -f "$out" ] && mv -f "$out" "$out.1"
    # Not a process group leader (no job control here), so setsid execs java in place: $! is
    # the JVM's PID.
    setsid "$JAVA" "${RMQ_JAVA_ARGS[@]}" $ROCKETMQ_JAVA_OPTS "$main" "$@" \
        </dev/null >"$out" 2>&1 &
    echo $! >"$ROCKETMQ_DATA_DIR/$role.pid"
}

# wait_up ROLE PORT LOG...: wait until ROLE's recorded process listens on PORT (and, for a
# broker, printed "boot success" to logs/ROLE.out).
wait_up() {
    local role=$1 port=$2 deadline=$((SECONDS + ROCKETMQ_START_TIMEOUT)) pid
    shift 2
    while :; do
        # The launched PID itself, alive or not: right after `setsid ... &` its command line can
        # still be setsid's (exec not done yet on a loaded machine), which pid_of would not match.
        pid=$(cat "$ROCKETMQ_DATA_DIR/$role.pid" 2>/dev/null || true)
        if ! [[ "$pid" =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null \
            || [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" = Z ]; then
            echo "rocketmq: error: $role exited during start-up" >&2
            log_tail "$@"
            exit 1
        fi
        if port_open "$port"; then
            if [ "$role" = namesrv ] || grep -q "boot success" "$RMQ_LOGS/$role.out"; then
                return 0
            fi
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "rocketmq: error: $role (pid $pid) not up on $ROCKETMQ_HOST:$port after ${ROCKETMQ_START_TIMEOUT}s" >&2
            log_tail "$@"
            exit 1
        fi
        sleep 0.2
    done
}

# stop_role ROLE SIGNAL: send SIGNAL (TERM or KILL), wait for the exit, KILL after the timeout.
stop_role() {
    local role=$1 sig=$2 pid deadline
    pid=$(pid_of "$role")
    if [ -z "$pid" ]; then
        rm -f "$ROCKETMQ_DATA_DIR/$role.pid"
        return 0
    fi
    kill "-$sig" "$pid" 2>/dev/null || true
    deadline=$((SECONDS + ROCKETMQ_STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "rocketmq: $role (pid $pid) ignored SIG$sig for ${ROCKETMQ_STOP_TIMEOUT}s; SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 10))
            sig=KILL
        fi
        sleep 0.1
    done
    rm -f "$ROCKETMQ_DATA_DIR/$role.pid"
    echo "rocketmq: $role (pid $pid) stopped"
}

start_namesrv() {
    local pid
    pid=$(pid_of namesrv)
    if [ -n "$pid" ]; then
        echo "rocketmq: namesrv already running (pid $pid) on $RMQ_LOCAL_NAMESRV"
        return 0
    fi
    port_open "$ROCKETMQ_NAMESRV_PORT" \
        && die "port $ROCKETMQ_NAMESRV_PORT is taken by another process; set ROCKETMQ_NAMESRV_PORT"
    render "$ROCKETMQ_DEPLOY_DIR/namesrv.conf" "$RMQ_CONF/namesrv.conf"
    rmq_java_common rmq.namesrv.logback.xml
    # shellcheck disable=SC2206
    RMQ_JAVA_ARGS=($ROCKETMQ_NAMESRV_HEAP "${RMQ_JAVA_ARGS[@]}")
    launch namesrv "$NAMESRV_MAIN" -c "$RMQ_CONF/namesrv.conf"
    wait_up namesrv "$ROCKETMQ_NAMESRV_PORT" "$RMQ_LOGS/namesrv.out" "$RMQ_LOGS/namesrv.log"
    echo "rocketmq: namesrv up (pid $(pid_of namesrv)) on $RMQ_LOCAL_NAMESRV"
}

# launch_broker INDEX ID: start that broker (select_broker) unless it runs; does not wait.
# Appends "INDEX ID" to RMQ_LAUNCHED when it started one.
launch_broker() {
    local pid p
    select_broker "$1" "$2"
    pid=$(pid_of "$B_ROLE")
    if [ -n "$pid" ]; then
        echo "rocketmq: $B_ROLE ($B_NAME id $B_ID) already running (pid $pid) on $B_ADDR"
        return 0
    fi
    port_open "$ROCKETMQ_NAMESRV_PORT" \
        || die "no NameServer on $RMQ_LOCAL_NAMESRV; start it first (start.sh)"
    for p in $((B_PORT - 2)) "$B_PORT" $((B_PORT + 1)); do
        port_open "$p" && die "port $p ($B_ROLE uses $((B_PORT - 2))..$((B_PORT + 1))) is taken by another process; set ROCKETMQ_BROKER_PORT"
    done
    mkdir -p "$B_STORE" "$B_LOG_DIR"
    render "$ROCKETMQ_DEPLOY_DIR/broker.conf" "$B_CONF"
    (umask 077 && acl_conf >>"$B_CONF")
    rmq_java_common rmq.broker.logback.xml "$B_LOG_DIR"
    # shellcheck disable=SC2206
    RMQ_JAVA_ARGS=($ROCKETMQ_BROKER_HEAP "${RMQ_JAVA_ARGS[@]}")
    launch "$B_ROLE" "$BROKER_MAIN" -c "$B_CONF" -n "$RMQ_LOCAL_NAMESRV"
    RMQ_LAUNCHED+=("$1 $2")
}

# await_broker INDEX ID: wait until that broker is up and registered with the NameServer.
await_broker() {
    select_broker "$1" "$2"
    wait_up "$B_ROLE" "$B_PORT" "$B_OUT" "$B_LOG_DIR/broker.log"
    wait_registered
    echo "rocketmq: $B_ROLE up ($B_NAME id $B_ID, $B_BROKER_ROLE, pid $(pid_of "$B_ROLE")) on $B_ADDR," \
        "registered at $RMQ_LOCAL_NAMESRV"
}

# start_brokers "INDEX ID"...: launch these brokers together, then wait for each of them.
start_brokers() {
    local b i id
    RMQ_LAUNCHED=()
    for b in "$@"; do
        read -r i id <<<"$b"
        launch_broker "$i" "$id"
    done
    for b in "${RMQ_LAUNCHED[@]}"; do
        read -r i id <<<"$b"
        await_broker "$i" "$id"
    done
}

# start_broker [INDEX [ID]]: start one broker (default group 0's master) and wait for it.
start_broker() {
    start_brokers "${1:-0} ${2:-0}"
}

# start_all_brokers: every broker RMQ_GROUPS/RMQ_SLAVES ask for, the masters first (a slave
# finds its master's HA address through the NameServer).
start_all_brokers() {
    local masters=() slaves=() b
    while read -r b; do
        if [ "${b#* }" = 0 ]; then masters+=("$b"); else slaves+=("$b"); fi
    done < <(broker_list)
    start_brokers "${masters[@]}"
    [ "${#slaves[@]}" -eq 0 ] || start_brokers "${slaves[@]}"
}

# stop_brokers SIGNAL: stop every broker with a PID file, all at once (an orderly stop takes
# ~20 s per broker).
stop_brokers() {
    local role
    for role in $(recorded_broker_roles); do
        stop_role "$role" "$1" &
    done
    wait
}

# run_admin ARGS...: MQAdminStartup with our classpath; adds -n unless given. Prints its output.
# MQAdminStartup exits 0 even when a command fails (it prints the stack trace), so fail on one.
run_admin() {
    local out status=0 a has_n=0
    for a in "$@"; do [ "$a" = -n ] && has_n=1; done
    rmq_java_common rmq.tools.logback.xml
    # shellcheck disable=SC2206
    RMQ_JAVA_ARGS=($ROCKETMQ_ADMIN_HEAP -XX:TieredStopAtLevel=1 "${RMQ_JAVA_ARGS[@]}")
    mkdir -p "$RMQ_LOGS" "$RMQ_HOME/conf"
    [ -f "$RMQ_HOME/conf/rmq.tools.logback.xml" ] || cp "$ROCKETMQ_DEPLOY_DIR/logback/rmq.tools.logback.xml" "$RMQ_HOME/conf/"
    if [ "$has_n" = 0 ] && [ $# -gt 0 ] && [ "$1" != help ]; then set -- "$@" -n "$ROCKETMQ_NAMESRV_ADDR"; fi
    # mqadmin signs its requests as the user in $ROCKETMQ_HOME/conf/tools.yml (AclUtils); the
    # file is removed without ACL so that a data dir restarted without it signs with nothing
    # stale.
    if [ "$ROCKETMQ_ACL" = 1 ]; then
        (umask 077 && printf 'accessKey: %s\nsecretKey: %s\n' "$ROCKETMQ_ACL_USER" \
            "${ROCKETMQ_ACL_PASSWORD:?ROCKETMQ_ACL_PASSWORD is not set: start.sh sets it}" \
            >"$RMQ_HOME/conf/tools.yml")
    else
        rm -f "$RMQ_HOME/conf/tools.yml"
    fi
    out=$("$JAVA" "${RMQ_JAVA_ARGS[@]}" $ROCKETMQ_JAVA_OPTS "$ADMIN_MAIN" "$@" 2>&1) || status=$?
    printf '%s\n' "$out"
    if [ "$status" -eq 0 ] && grep -qE '^(org\.apache\.rocketmq|java\.|io\.netty)[A-Za-z0-9_.$]*(Exception|Error)\b|^Caused by: |^The sub command .* not exist' <<<"$out"; then
        status=1
    fi
    return "$status"
}

# wait_registered: until the NameServer lists the selected broker (select_broker; probe.py
# nudges it to register at once instead of its first periodic registration 10 s after start).
wait_registered() {
    local secured=()
    mapfile -t secured < <(probe_env)
    if ! env "${secured[@]}" "${PYTHON:-python3}" "$ROCKETMQ_DEPLOY_DIR/probe.py" wait-registered \
        "$RMQ_LOCAL_NAMESRV" "$B_ADDR" "$ROCKETMQ_START_TIMEOUT"; then
        log_tail "$B_OUT" "$B_LOG_DIR/broker.log" "$RMQ_LOGS/namesrv.log"
        die "$B_ROLE $B_ADDR did not register with the NameServer $RMQ_LOCAL_NAMESRV"
    fi
}

# The (child) processes were started by us; `kill -0` on a zombie succeeds, but setsid'd JVMs
# are reparented to init, which reaps them, so the loops above terminate.
