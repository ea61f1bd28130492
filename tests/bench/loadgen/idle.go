package main

// Idle mode (-mode idle): hold many idle MQTT connections, for the
// connection-capacity benchmark (tests/bench/conn_capacity.py), which measures
// the broker's memory per connection between steps. The process is driven by
// one command per line on stdin and answers each with one JSON line on stdout:
//
//	open N   dial N more connections (round-robin over the -src addresses),
//	         send CONNECT (clean session, -keepalive) and wait for each CONNACK;
//	         at most -concurrency at once, the whole step capped by -step-timeout
//	ping     PINGREQ on every held connection and wait for each PINGRESP (the
//	         proof that the broker still serves them); failed ones are dropped
//	close    DISCONNECT and close every held connection, then exit
//
// EOF on stdin counts as close. -timeout is a hard cap on the whole process.
// An idle connection costs no goroutine here: the connections are only read
// while a ping is under way, so the load generator stays small at 10k+
// connections and the broker is the only side being measured.

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	idleSources     = flag.String("src", "", "idle: comma-separated local IPs to dial from, round-robin (default: the kernel's choice)")
	idleKeepalive   = flag.Int("keepalive", 600, "idle: keepalive in seconds sent in CONNECT")
	idleConcurrency = flag.Int("concurrency", 50, "idle: connections opened (or pinged) at once")
	idleStepTimeout = flag.Duration("step-timeout", 60*time.Second, "idle: cap on one open, ping or close command")
)

// idleIOTimeout bounds each dial, CONNECT/CONNACK and PINGREQ/PINGRESP exchange.
const idleIOTimeout = 10 * time.Second

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT (not in Go's syscall package on
// amd64). With it, binding to a -src address leaves the port to connect(), which needs only
// the 4-tuple to be unique: bind() alone reserves a port of that address for every
// destination and skips ports still in TIME_WAIT, so tens of thousands of connections from
// one address (and back-to-back runs) exhaust it and make every bind scan the port range.
const ipBindAddressNoPort = 24

// IdleReply is the JSON answer to one command.
type IdleReply struct {
	Op        string         `json:"op"`
	Requested int            `json:"requested"`
	OK        int            `json:"ok"`
	Failed    int            `json:"failed"`
	Held      int            `json:"held"`
	ElapsedS  float64        `json:"elapsed_s"`
	PerS      float64        `json:"per_s"`
	Latency   *LatencyStats  `json:"latency,omitempty"`
	FailedBy  map[string]int `json:"failed_by"`
	Errors    []string       `json:"errors"`
}

type idleHolder struct {
	addr        string
	id          string
	sources     []*net.TCPAddr
	keepalive   int
	concurrency int
	stepTimeout time.Duration
	conns       []net.Conn // held connections
	dialed      int        // connections attempted so far: numbers client ids and picks sources
}

// failure is one connection's failure: kind is the phase, for the failed_by counts.
type failure struct {
	kind string
	err  error
}

func runIdle(addr, id string, timeout time.Duration) {
	h := &idleHolder{addr: addr, id: id, keepalive: *idleKeepalive,
		concurrency: max(*idleConcurrency, 1), stepTimeout: *idleStepTimeout}
	if *idleKeepalive < 0 || *idleKeepalive > 65535 {
		fatal("-keepalive must be in 0..65535")
	}
	for _, s := range strings.Split(*idleSources, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		ip := net.ParseIP(s)
		if ip == nil {
			fatal(fmt.Sprintf("-src: %q is not an IP address", s))
		}
		h.sources = append(h.sources, &net.TCPAddr{IP: ip})
	}
	time.AfterFunc(timeout, func() { fatal(fmt.Sprintf("hard timeout %v reached", timeout)) })

	enc := json.NewEncoder(os.Stdout)
	emit := func(r IdleReply) {
		if r.Errors == nil {
			r.Errors = []string{}
		}
		if r.FailedBy == nil {
			r.FailedBy = map[string]int{}
		}
		_ = enc.Encode(r)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) == 0 {
			continue
		}
		var reply IdleReply
		switch {
		case fields[0] == "open" && len(fields) == 2:
			n, err := strconv.Atoi(fields[1])
			if err != nil || n < 0 {
				reply = IdleReply{Op: "error", Errors: []string{"open needs a count >= 0"}}
				break
			}
			reply = h.open(n)
		case fields[0] == "ping":
			reply = h.ping()
		case fields[0] == "close":
			emit(h.close())
			return
		default:
			reply = IdleReply{Op: "error", Errors: []string{fmt.Sprintf("unknown command %q", in.Text())}}
		}
		emit(reply)
	}
	emit(h.close())
}

// forEach runs fn(i) for i in 0..n-1 on at most h.concurrency goroutines until
// the step deadline; indexes not started by then fail as "step_timeout".
func (h *idleHolder) forEach(op string, n int, fn func(i int, deadline time.Time) *failure) IdleReply {
	start := time.Now()
	stepEnd := start.Add(h.stepTimeout)
	var next atomic.Int64
	var mu sync.Mutex
	reply := IdleReply{Op: op, Requested: n, FailedBy: map[string]int{}}
	errs := &errList{}
	var wg sync.WaitGroup
	for w := 0; w < min(h.concurrency, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				var f *failure
				if time.Now().After(stepEnd) {
					f = &failure{"step_timeout", fmt.Errorf("not started within -step-timeout %v", h.stepTimeout)}
				} else {
					deadline := time.Now().Add(idleIOTimeout)
					if deadline.After(stepEnd) {
						deadline = stepEnd
					}
					f = fn(i, deadline)
				}
				mu.Lock()
				if f == nil {
					reply.OK++
				} else {
					reply.Failed++
					reply.FailedBy[f.kind]++
				}
				mu.Unlock()
				if f != nil {
					errs.add("%s: %v", f.kind, f.err)
				}
			}
		}()
	}
	wg.Wait()
	reply.ElapsedS = time.Since(start).Seconds()
	if reply.ElapsedS > 0 {
		reply.PerS = float64(reply.OK) / reply.ElapsedS
	}
	reply.Errors = errs.errs
	return reply
}

func (h *idleHolder) open(n int) IdleReply {
	first := h.dialed
	h.dialed += n
	opened := make([]net.Conn, n)
	took := make([]int64, n) // ns from dial to CONNACK
	reply := h.forEach("open", n, func(i int, deadline time.Time) *failure {
		t0 := time.Now()
		c, f := h.dial(first+i, deadline)
		if f == nil {
			opened[i], took[i] = c, int64(time.Since(t0))
		}
		return f
	})
	var lat []int64
	for i, c := range opened {
		if c != nil {
			h.conns = append(h.conns, c)
			lat = append(lat, took[i])
		}
	}
	reply.Held = len(h.conns)
	reply.Latency = latencyStats(lat)
	return reply
}

// dial opens connection number k and completes the CONNECT/CONNACK exchange.
func (h *idleHolder) dial(k int, deadline time.Time) (net.Conn, *failure) {
	d := net.Dialer{Deadline: deadline, KeepAlive: -1}
	if len(h.sources) > 0 {
		d.LocalAddr = h.sources[k%len(h.sources)]
		d.Control = bindAddressNoPort
	}
	conn, err := d.Dial("tcp", h.addr)
	if err != nil {
		return nil, &failure{"dial", err}
	}
	fail := func(kind string, err error) (net.Conn, *failure) {
		conn.Close()
		return nil, &failure{kind, err}
	}
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write(connectPacket(fmt.Sprintf("%s-%d", h.id, k), h.keepalive)); err != nil {
		return fail("connect_write", err)
	}
	var ack [4]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil {
		return fail("connack_read", err)
	}
	if ack[0]>>4 != pktConnack || ack[1] != 2 {
		return fail("connack_bad", fmt.Errorf("not a CONNACK: % x", ack))
	}
	if ack[3] != 0 {
		return fail("connack_refused", fmt.Errorf("CONNACK return code %d", ack[3]))
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

func (h *idleHolder) ping() IdleReply {
	conns := h.conns
	dead := make([]bool, len(conns))
	took := make([]int64, len(conns))
	reply := h.forEach("ping", len(conns), func(i int, deadline time.Time) *failure {
		c := conns[i]
		t0 := time.Now()
		_ = c.SetDeadline(deadline)
		var f *failure
		var resp [2]byte
		if _, err := c.Write([]byte{pktPingreq << 4, 0}); err != nil {
			f = &failure{"pingreq_write", err}
		} else if _, err := io.ReadFull(c, resp[:]); err != nil {
			f = &failure{"pingresp_read", err}
		} else if resp != [2]byte{pktPingresp << 4, 0} {
			f = &failure{"pingresp_bad", fmt.Errorf("expected PINGRESP, got % x", resp)}
		}
		if f != nil {
			dead[i] = true
			c.Close()
			return f
		}
		_ = c.SetDeadline(time.Time{})
		took[i] = int64(time.Since(t0))
		return nil
	})
	h.conns = h.conns[:0]
	var lat []int64
	for i, c := range conns {
		if !dead[i] {
			h.conns = append(h.conns, c)
			lat = append(lat, took[i])
		}
	}
	reply.Held = len(h.conns)
	reply.Latency = latencyStats(lat)
	return reply
}

func (h *idleHolder) close() IdleReply {
	conns := h.conns
	h.conns = nil
	return h.forEach("close", len(conns), func(i int, deadline time.Time) *failure {
		c := conns[i]
		_ = c.SetWriteDeadline(deadline)
		_, err := c.Write([]byte{pktDisconn << 4, 0})
		if cerr := c.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return &failure{"disconnect", err}
		}
		return nil
	})
}

// bindAddressNoPort sets IP_BIND_ADDRESS_NO_PORT on a socket before it is bound.
func bindAddressNoPort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
