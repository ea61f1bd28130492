// Command loadgen is the MQTT load generator used by tests/bench/run_bench.py.
//
// It runs one scenario against one broker and prints a single JSON object on
// stdout. Modes:
//
//	throughput: N publishers, M subscribers on one topic (or -pairs); publishers send as
//	            fast as they can (QoS 1: bounded window of unacked publishes)
//	            until -count messages are sent or -duration elapses; the run
//	            ends when every expected delivery arrived, when nothing arrived
//	            for -idle after publishing finished, or at -timeout.
//	latency:    publishers send at a fixed total -rate for -duration with a
//	            monotonic send timestamp in the payload; the subscriber records
//	            publish->receive deltas and reports p50/p90/p99/max.
//	idle:       hold many idle connections for a connection-capacity measurement,
//	            driven by commands on stdin (see idle.go).
//
// With -stamp, throughput mode also timestamps every payload and reports the
// same latency percentiles, measured under full load. With -pairs (needs
// -pubs == -subs), publisher i and subscriber i get a topic of their own
// (<topic><i>), so every message is delivered once instead of to every
// subscriber.
//
// For a cluster, -pub-addr and -sub-addr put publishers and subscribers on
// different nodes (publisher i connects to the i-th address of its list,
// round-robin), so that messages cross from node to node while publisher and
// subscriber still share this process's clock; behind a load balancer that
// gives consecutive connections to different nodes, -interleave does the same.
// -settle waits after the last SUBACK before publishing: a cluster replicates
// subscriptions to the other nodes asynchronously, and a publish that reaches a
// node before the subscription does is not routed to it.
//
// -protocol 5 makes every connection of the raw client MQTT 5.0 instead of 3.1.1 (see
// raw.go); -props adds a Content Type and a User Property to every 5.0 PUBLISH. A server's
// Receive Maximum below -window becomes the window (window_effective in the result).
//
// Every loop is bounded by a message count and by the -timeout deadline.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type LatencyStats struct {
	Samples int     `json:"samples"`
	MinMs   float64 `json:"min_ms"`
	MeanMs  float64 `json:"mean_ms"`
	P50Ms   float64 `json:"p50_ms"`
	P90Ms   float64 `json:"p90_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
}

type Result struct {
	Mode          string        `json:"mode"`
	Client        string        `json:"client"`
	Protocol      int           `json:"protocol"`
	Props         bool          `json:"props,omitempty"`
	ReceiveMax    int           `json:"receive_maximum,omitempty"`
	QoS           int           `json:"qos"`
	Pubs          int           `json:"pubs"`
	Subs          int           `json:"subs"`
	Pairs         bool          `json:"pairs,omitempty"`
	Size          int           `json:"size"`
	Window        int           `json:"window,omitempty"`
	WindowEff     int           `json:"window_effective,omitempty"`
	ServerRecvMax int           `json:"server_receive_maximum,omitempty"`
	TargetRate    float64       `json:"target_rate,omitempty"`
	Sent          int64         `json:"sent"`
	Expected      int64         `json:"expected"`
	Delivered     int64         `json:"delivered"`
	Lost          int64         `json:"lost"`
	Extra         int64         `json:"extra"`
	Acked         int64         `json:"acked"`
	Refused       int64         `json:"refused,omitempty"`
	ElapsedS      float64       `json:"elapsed_s"`
	MsgsPerS      float64       `json:"msgs_per_s"`
	MBPerS        float64       `json:"mb_per_s"`
	PublishS      float64       `json:"publish_s"`
	PublishRate   float64       `json:"publish_rate"`
	LateSends     int64         `json:"late_sends,omitempty"`
	StopReason    string        `json:"stop_reason"`
	CPUSeconds    float64       `json:"loadgen_cpu_s"`
	CPUPercent    float64       `json:"loadgen_cpu_percent"`
	WallS         float64       `json:"wall_s"`
	Latency       *LatencyStats `json:"latency,omitempty"`
	Errors        []string      `json:"errors"`
	ClientIDStart string        `json:"client_id_prefix"`
}

var base = time.Now() // monotonic reference for timestamps in payloads

func mono() int64 { return int64(time.Since(base)) }

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

type subState struct {
	count atomic.Int64
	first atomic.Int64
	last  atomic.Int64
	mu    sync.Mutex
	lat   []int64 // latency mode and -stamp only
}

type errList struct {
	mu   sync.Mutex
	errs []string
}

func (e *errList) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.errs) < 20 {
		e.errs = append(e.errs, fmt.Sprintf(format, args...))
	}
}

func percentile(sorted []int64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return float64(sorted[i]) / 1e6
}

// latencyStats summarises durations (ns, sorted in place); nil when there are none.
func latencyStats(ns []int64) *LatencyStats {
	if len(ns) == 0 {
		return nil
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	var sum float64
	for _, v := range ns {
		sum += float64(v)
	}
	return &LatencyStats{
		Samples: len(ns),
		MinMs:   float64(ns[0]) / 1e6,
		MeanMs:  sum / float64(len(ns)) / 1e6,
		P50Ms:   percentile(ns, 0.50),
		P90Ms:   percentile(ns, 0.90),
		P99Ms:   percentile(ns, 0.99),
		MaxMs:   float64(ns[len(ns)-1]) / 1e6,
	}
}

func main() {
	mode := flag.String("mode", "throughput", "throughput | latency | idle")
	kind := flag.String("client", "raw", "raw (hand-written MQTT 3.1.1 / 5.0) | paho (eclipse paho.mqtt.golang, 3.1.1 only)")
	protocol := flag.Int("protocol", 4, "MQTT protocol level: 4 (3.1.1) or 5 (5.0, -client raw only)")
	props := flag.Bool("props", false, "-protocol 5: a Content Type and a User Property on every PUBLISH")
	recvMax := flag.Int("receive-maximum", 0, "-protocol 5: Receive Maximum in every CONNECT (libmosquitto's 5.0 clients send 20); 0: none (65535)")
	addr := flag.String("addr", "127.0.0.1:1883", "broker host:port")
	pubs := flag.Int("pubs", 1, "number of publisher connections")
	subs := flag.Int("subs", 1, "number of subscriber connections (all on the same topic unless -pairs)")
	qos := flag.Int("qos", 0, "QoS for publish and subscribe (0, 1 or 2)")
	size := flag.Int("size", 100, "payload size in bytes")
	count := flag.Int64("count", 100000, "throughput: total messages to publish (all publishers); latency: cap")
	duration := flag.Duration("duration", 20*time.Second, "cap on the publish phase (latency: its length)")
	timeout := flag.Duration("timeout", 30*time.Second, "hard cap on the whole run incl. connect and drain")
	rate := flag.Float64("rate", 2000, "latency: total publish rate in msgs/s")
	window := flag.Int("window", 100, "QoS 1/2: max unacknowledged publishes per publisher (5.0: at most the server's Receive Maximum)")
	idle := flag.Duration("idle", 2*time.Second, "stop when nothing arrived for this long after publishing ended")
	idPrefix := flag.String("id", "", "client id prefix (default: random per run)")
	topicFlag := flag.String("topic", "", "topic (default: bench/<id>/t)")
	pairs := flag.Bool("pairs", false, "publisher i -> subscriber i on topic <topic><i> (needs -pubs == -subs); default: every subscriber on one topic")
	stamp := flag.Bool("stamp", false, "throughput: also timestamp every payload and report publish->receive latency (needs -size >= 16)")
	pubAddr := flag.String("pub-addr", "", "comma-separated host:port list the publishers connect to, round-robin (default: -addr)")
	subAddr := flag.String("sub-addr", "", "comma-separated host:port list the subscribers connect to, round-robin (default: -addr)")
	settle := flag.Duration("settle", 0, "pause between the last SUBACK and the first publish (a cluster: time for subscriptions to reach every node)")
	interleave := flag.Bool("interleave", false, "connect subscriber 0, publisher 0, subscriber 1, ... instead of all subscribers first (behind a balancer that spreads consecutive connections, each pair is split over two nodes)")
	flag.Parse()

	id := *idPrefix
	if id == "" {
		id = randomID()
	}
	if *mode == "idle" {
		runIdle(*addr, id, *timeout)
		return
	}

	start := time.Now()
	deadline := start.Add(*timeout)
	errs := &errList{}

	if *qos < 0 || *qos > 2 {
		fatal("qos must be 0, 1 or 2")
	}
	if *protocol != 4 && *protocol != 5 {
		fatal("protocol must be 4 (MQTT 3.1.1) or 5 (MQTT 5.0)")
	}
	if *protocol == 5 && *kind != "raw" {
		fatal("-protocol 5 needs -client raw (paho.mqtt.golang speaks MQTT 3.1.1 only)")
	}
	if (*props || *recvMax != 0) && *protocol != 5 {
		fatal("-props and -receive-maximum need -protocol 5")
	}
	if *recvMax < 0 || *recvMax > 65535 {
		fatal("-receive-maximum must be in 1..65535 (0: not sent)")
	}
	if *pubs < 1 || *subs < 1 || *pubs > 1000 || *subs > 1000 {
		fatal("pubs and subs must be in 1..1000")
	}
	if (*mode == "latency" || *stamp) && *size < 16 {
		fatal("latency mode and -stamp need -size >= 16")
	}
	if *pairs && *pubs != *subs {
		fatal("-pairs needs -pubs == -subs")
	}
	if *mode != "latency" && *mode != "throughput" {
		fatal("mode must be throughput, latency or idle")
	}
	if *size < 0 || *size > 256*1024*1024 {
		fatal("bad size")
	}
	topic := *topicFlag
	if topic == "" {
		topic = "bench/" + id + "/t"
	}
	topicOf := func(i int) string {
		if *pairs {
			return fmt.Sprintf("%s%d", topic, i)
		}
		return topic
	}
	// Deliveries per published message.
	fanout := int64(*subs)
	if *pairs {
		fanout = 1
	}
	latency := *mode == "latency"
	// Record publish->receive deltas: always in latency mode, with -stamp in throughput mode.
	recordLat := latency || *stamp
	total := *count
	if latency {
		n := int64(*rate * duration.Seconds())
		if n < total {
			total = n
		}
	}

	res := Result{Mode: *mode, Client: *kind, Protocol: *protocol, Props: *props,
		ReceiveMax: *recvMax, QoS: *qos,
		Pubs: *pubs, Subs: *subs, Size: *size, Pairs: *pairs, ClientIDStart: id, Errors: []string{}}
	if *qos > 0 {
		res.Window = *window
	}
	if latency {
		res.TargetRate = *rate
	}

	pubAddrs := addrList(*pubAddr, *addr)
	subAddrs := addrList(*subAddr, *addr)
	cfg := func(addr, cid string) ClientConfig {
		return ClientConfig{Kind: *kind, Addr: addr, ClientID: cid, Protocol: byte(*protocol),
			PubProps: *props, ReceiveMax: *recvMax, Window: *window, Deadline: deadline,
			Timeout: 5 * time.Second}
	}

	// Every SUBACK is in before anybody publishes: publishing starts once all clients are
	// connected. Subscribers connect first, or with -interleave subscriber i then publisher i.
	states := make([]*subState, *subs)
	subClients := make([]Client, 0, *subs)
	pubClients := make([]Client, 0, *pubs)
	closeAll := func() {
		for _, c := range pubClients {
			c.Close()
		}
		for _, c := range subClients {
			c.Close()
		}
	}
	connectSub := func(i int) {
		st := &subState{}
		states[i] = st
		if recordLat {
			// Each subscriber gets at most `total` messages (all on one topic).
			st.lat = make([]int64, 0, min(total, 1<<20))
		}
		handler := func(p []byte) {
			now := mono()
			n := st.count.Add(1)
			if n == 1 {
				st.first.Store(now)
			}
			st.last.Store(now)
			if recordLat && len(p) >= 16 {
				sent := int64(binary.BigEndian.Uint64(p))
				st.mu.Lock()
				if int64(len(st.lat)) < total {
					st.lat = append(st.lat, now-sent)
				}
				st.mu.Unlock()
			}
		}
		c, err := NewClient(cfg(subAddrs[i%len(subAddrs)], fmt.Sprintf("%s-s%d", id, i)))
		if err != nil {
			closeAll()
			fatal(fmt.Sprintf("subscriber %d connect: %v", i, err))
		}
		subClients = append(subClients, c)
		if err := c.Subscribe(topicOf(i), byte(*qos), handler, time.Until(deadline)); err != nil {
			closeAll()
			fatal(fmt.Sprintf("subscriber %d subscribe: %v", i, err))
		}
	}
	connectPub := func(i int) {
		c, err := NewClient(cfg(pubAddrs[i%len(pubAddrs)], fmt.Sprintf("%s-p%d", id, i)))
		if err != nil {
			closeAll()
			fatal(fmt.Sprintf("publisher %d connect: %v", i, err))
		}
		pubClients = append(pubClients, c)
	}
	if *interleave {
		for i := 0; i < max(*subs, *pubs); i++ {
			if i < *subs {
				connectSub(i)
			}
			if i < *pubs {
				connectPub(i)
			}
		}
	} else {
		for i := 0; i < *subs; i++ {
			connectSub(i)
		}
		for i := 0; i < *pubs; i++ {
			connectPub(i)
		}
	}
	if *settle > 0 {
		time.Sleep(min(*settle, time.Until(deadline)))
	}

	cpu0 := cpuSeconds()
	wall0 := time.Now()
	var sent, late atomic.Int64
	var firstSend atomic.Int64
	firstSend.Store(math.MaxInt64)
	var lastSend atomic.Int64
	pubEnd := wall0.Add(*duration)
	if latency {
		// The schedule itself ends at -duration; allow for sleep overshoot.
		pubEnd = pubEnd.Add(*duration/5 + 100*time.Millisecond)
	}
	if pubEnd.After(deadline) {
		pubEnd = deadline
	}

	var wg sync.WaitGroup
	var pubsDone atomic.Int32
	for i, c := range pubClients {
		share := total / int64(*pubs)
		if int64(i) < total%int64(*pubs) {
			share++
		}
		wg.Add(1)
		go func(c Client, share int64, topic string) {
			defer wg.Done()
			defer pubsDone.Add(1)
			payload := make([]byte, *size)
			for j := range payload {
				payload[j] = 'x'
			}
			interval := time.Duration(0)
			if latency {
				interval = time.Duration(float64(time.Second) * float64(*pubs) / *rate)
			}
			t0 := mono()
			for {
				old := firstSend.Load()
				if t0 >= old || firstSend.CompareAndSwap(old, t0) {
					break
				}
			}
			sched := time.Now()
			var n int64
			for n = 0; n < share; n++ {
				if latency {
					sched = sched.Add(interval)
					now := time.Now()
					if d := sched.Sub(now); d > 0 {
						time.Sleep(d)
					} else if d < -time.Millisecond {
						late.Add(1)
					}
					if now.After(pubEnd) {
						break
					}
					binary.BigEndian.PutUint64(payload[0:], uint64(mono()))
					binary.BigEndian.PutUint64(payload[8:], uint64(n))
				} else {
					if n&255 == 0 && time.Now().After(pubEnd) {
						break
					}
					if *stamp {
						// Taken before Publish, so a wait for a free slot in the
						// QoS 1 window counts as latency too.
						binary.BigEndian.PutUint64(payload[0:], uint64(mono()))
						binary.BigEndian.PutUint64(payload[8:], uint64(n))
					}
				}
				if err := c.Publish(topic, byte(*qos), payload, latency); err != nil {
					errs.add("publish: %v", err)
					break
				}
			}
			if err := c.Flush(); err != nil {
				errs.add("flush: %v", err)
			}
			sent.Add(n)
			lastSend.Store(mono())
			if *qos > 0 {
				ackBy := time.Now().Add(*timeout)
				if ackBy.After(deadline) {
					ackBy = deadline
				}
				if err := c.WaitAcked(ackBy); err != nil {
					errs.add("waiting for PUBACKs: %v", err)
				}
			}
		}(c, share, topicOf(i))
	}

	// Monitor: stop when complete, idle after publishing, or at the deadline.
	delivered := func() int64 {
		var d int64
		for _, st := range states {
			d += st.count.Load()
		}
		return d
	}
	lastRecv := func() int64 {
		var l int64
		for _, st := range states {
			if v := st.last.Load(); v > l {
				l = v
			}
		}
		return l
	}
	reason := "timeout"
	var pubDoneAt int64
	for time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
		if int(pubsDone.Load()) < *pubs {
			continue
		}
		if pubDoneAt == 0 {
			pubDoneAt = mono()
		}
		exp := sent.Load() * fanout
		if delivered() >= exp {
			reason = "complete"
			break
		}
		now := mono()
		quiet := now - lastRecv()
		if now-pubDoneAt > int64(*idle) && quiet > int64(*idle) {
			reason = "idle"
			break
		}
		if failed := anyErr(subClients); failed != nil {
			errs.add("subscriber connection: %v", failed)
			reason = "error"
			break
		}
	}
	wallEnd := time.Now()
	cpu1 := cpuSeconds()
	if reason == "timeout" {
		errs.add("hard timeout %v reached", *timeout)
	}
	// Stop the publishers if they are still going (timeout) and wait a moment.
	closeAll()
	waitCh := make(chan struct{})
	go func() { wg.Wait(); close(waitCh) }()
	select {
	case <-waitCh:
	case <-time.After(3 * time.Second):
		errs.add("publishers did not stop within 3s after close")
	}
	for _, c := range pubClients {
		if err := c.Err(); err != nil {
			errs.add("publisher connection: %v", err)
		}
	}

	res.Sent = sent.Load()
	res.Expected = res.Sent * fanout
	res.Delivered = delivered()
	if res.Delivered < res.Expected {
		res.Lost = res.Expected - res.Delivered
	} else {
		res.Extra = res.Delivered - res.Expected
	}
	for _, c := range pubClients {
		res.Acked += c.Acked()
	}
	// 5.0: refused acknowledgements (both sides) and the window the server's Receive Maximum
	// left the publishers (the smallest, when it is below -window).
	for _, c := range append(append([]Client{}, pubClients...), subClients...) {
		if rc, ok := c.(*rawClient); ok {
			res.Refused += rc.Refused()
		}
	}
	for _, c := range pubClients {
		if rc, ok := c.(*rawClient); ok && *protocol == 5 {
			if rm := rc.ServerReceiveMaximum(); res.ServerRecvMax == 0 || rm < res.ServerRecvMax {
				res.ServerRecvMax = rm
			}
			if *qos > 0 && rc.Window() < *window && (res.WindowEff == 0 || rc.Window() < res.WindowEff) {
				res.WindowEff = rc.Window()
			}
		}
	}
	fs := firstSend.Load()
	if lr := lastRecv(); res.Delivered > 0 && fs != math.MaxInt64 && lr > fs {
		res.ElapsedS = float64(lr-fs) / 1e9
		res.MsgsPerS = float64(res.Delivered) / res.ElapsedS
		res.MBPerS = res.MsgsPerS * float64(*size) / 1e6
	}
	if ls := lastSend.Load(); fs != math.MaxInt64 && ls > fs {
		res.PublishS = float64(ls-fs) / 1e9
		res.PublishRate = float64(res.Sent) / res.PublishS
	}
	res.LateSends = late.Load()
	res.StopReason = reason
	res.WallS = wallEnd.Sub(wall0).Seconds()
	res.CPUSeconds = cpu1 - cpu0
	if res.WallS > 0 {
		res.CPUPercent = 100 * res.CPUSeconds / res.WallS
	}
	if recordLat {
		var all []int64
		for _, st := range states {
			st.mu.Lock()
			all = append(all, st.lat...)
			st.mu.Unlock()
		}
		ls := latencyStats(all)
		if ls == nil {
			ls = &LatencyStats{}
		}
		res.Latency = ls
	}
	res.Errors = append(res.Errors, errs.errs...)
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

// randomID is the default client id prefix: unique per run, so runs never share sessions.
func randomID() string {
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	return fmt.Sprintf("lg%d-%s", os.Getpid(), hex.EncodeToString(rb[:]))
}

// addrList splits a comma-separated "host:port,host:port" list; an empty list is fallback.
func addrList(list, fallback string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		out = []string{fallback}
	}
	return out
}

func anyErr(cs []Client) error {
	for _, c := range cs {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

func fatal(msg string) {
	out, _ := json.Marshal(map[string]any{"fatal": msg, "errors": []string{msg}})
	fmt.Println(string(out))
	fmt.Fprintln(os.Stderr, "loadgen:", msg)
	os.Exit(2)
}
