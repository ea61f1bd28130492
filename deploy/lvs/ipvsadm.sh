#!/usr/bin/env bash
# The virtual server of keepalived.conf set up by hand with ipvsadm: no health checks and no
# VIP failover (keepalived's job), for a lab, an emergency, or to see what keepalived does.
# Run as root. Not tested in this repository (no second machine, no IPVS in the test VM).
#
# On the director:
#   ipvsadm.sh up VIP NODE_IP [NODE_IP...]   VIP on $IFACE, service VIP:PORT with these nodes
#   ipvsadm.sh add VIP NODE_IP               a new node joins (weight $WEIGHT)
#   ipvsadm.sh drain VIP NODE_IP             weight 0: no new clients, connected ones stay
#   ipvsadm.sh remove VIP NODE_IP            out of the table (stop the node first; its
#                                            clients reconnect to the others)
#   ipvsadm.sh down VIP                      service and VIP removed
#   ipvsadm.sh status                        nodes with active/inactive connection counts
# On every node, DR mode only:
#   ipvsadm.sh realserver VIP                VIP on lo and the ARP settings (README.md)
#
# Settings: PORT (1883; run again with PORT=8883 for MQTT over TLS), MODE (dr | nat),
#           SCHEDULER (wlc, as keepalived.conf; equal weights make it plain least connections),
#           WEIGHT (100), IFACE (eth0, the director's interface for the VIP)
set -euo pipefail

: "${PORT:=1883}"
: "${MODE:=dr}"
: "${SCHEDULER:=wlc}"
: "${WEIGHT:=100}"
: "${IFACE:=eth0}"

die() {
    echo "ipvsadm.sh: error: $*" >&2
    exit 1
}

case "$MODE" in
    dr) forward=-g ;;  # gatewaying: direct routing
    nat) forward=-m ;; # masquerading
    *) die "MODE must be dr or nat, not '$MODE'" ;;
esac

# args N USAGE "$@": exactly N arguments (N+ when N ends in +), else the usage line.
args() {
    local want=$1 usage=$2
    shift 2
    if [[ "$want" == *+ ]]; then [ $# -ge "${want%+}" ]; else [ $# -eq "$want" ]; fi \
        || die "usage: ipvsadm.sh $usage"
}

cmd=${1:-}
[ $# -eq 0 ] || shift
case "$cmd" in
    up)
        args 2+ "up VIP NODE_IP [NODE_IP...]" "$@"
        vip=$1
        shift
        ip addr replace "$vip/32" dev "$IFACE"
        # Idle established connections stay 1 h in the table (kernel default 15 min), longer
        # than any MQTT keep-alive (tcp, tcpfin, udp timeouts in seconds).
        ipvsadm --set 3600 120 300
        # A packet of a connection whose node was removed expires that entry at once; the
        # client then gets a reset and reconnects instead of waiting for its keep-alive.
        sysctl -qw net.ipv4.vs.expire_nodest_conn=1
        if [ "$MODE" = nat ]; then sysctl -qw net.ipv4.ip_forward=1; fi
        ipvsadm -A -t "$vip:$PORT" -s "$SCHEDULER"
        for node in "$@"; do
            ipvsadm -a -t "$vip:$PORT" -r "$node:$PORT" "$forward" -w "$WEIGHT"
        done
        ;;
    add)
        args 2 "add VIP NODE_IP" "$@"
        ipvsadm -a -t "$1:$PORT" -r "$2:$PORT" "$forward" -w "$WEIGHT"
        ;;
    drain)
        args 2 "drain VIP NODE_IP" "$@"
        ipvsadm -e -t "$1:$PORT" -r "$2:$PORT" "$forward" -w 0
        ;;
    remove)
        args 2 "remove VIP NODE_IP" "$@"
        ipvsadm -d -t "$1:$PORT" -r "$2:$PORT"
        ;;
    down)
        args 1 "down VIP" "$@"
        ipvsadm -D -t "$1:$PORT"
        ip addr del "$1/32" dev "$IFACE"
        ;;
    status)
        args 0 "status" "$@"
        ipvsadm -L -n
        ;;
    realserver)
        args 1 "realserver VIP" "$@"
        # Answer ARP only for addresses of the interface the request came in on: never for
        # the VIP, which lives on lo (the director answers for it).
        sysctl -qw net.ipv4.conf.all.arp_ignore=1
        # Never use the VIP as the source address of our own ARP requests.
        sysctl -qw net.ipv4.conf.all.arp_announce=2
        # The node accepts packets addressed to the VIP and answers clients from it.
        ip addr replace "$1/32" dev lo
        ;;
    *)
        die "usage: ipvsadm.sh up|add|drain|remove|down|status|realserver ... (see the header)"
        ;;
esac
