package main

// A minimal MQTT 3.1.1 client written for this benchmark: CONNECT/CONNACK,
// SUBSCRIBE/SUBACK, PUBLISH at QoS 0 and 1, PUBACK (both directions). It
// batches outgoing bytes in a bufio.Writer so that the load generator spends
// as little CPU per message as possible, leaving more of the (shared) cores
// to the broker under test.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	pktConnect   = 1
	pktConnack   = 2
	pktPublish   = 3
	pktPuback    = 4
	pktSubscribe = 8
	pktSuback    = 9
	pktPingreq   = 12
	pktPingresp  = 13
	pktDisconn   = 14
)

type rawClient struct {
	conn     net.Conn
	r        *bufio.Reader
	wmu      sync.Mutex
	w        *bufio.Writer
	deadline time.Time

	nextID   uint16 // publisher goroutine only
	window   int64
	lowWater int64
	inflight atomic.Int64 // QoS 1 publishes sent and not yet acked
	waiting  atomic.Bool  // publisher is blocked on a full window
	wake     chan struct{}
	sent1    atomic.Int64 // QoS 1 publishes sent
	acked    atomic.Int64

	handler atomic.Pointer[MsgHandler]
	subWait chan byte // SUBACK return codes

	errOnce sync.Once
	err     atomic.Pointer[error]
	done    chan struct{}
	closed  atomic.Bool
}

func appendVarint(b []byte, n int) []byte {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// connectPacket is an MQTT 3.1.1 CONNECT: protocol "MQTT" level 4, clean session, no
// will, no credentials.
func connectPacket(clientID string, keepalive int) []byte {
	vh := appendString(nil, "MQTT")
	vh = append(vh, 4, 0x02, byte(keepalive>>8), byte(keepalive))
	vh = appendString(vh, clientID)
	pkt := append([]byte{pktConnect << 4}, appendVarint(nil, len(vh))...)
	return append(pkt, vh...)
}

func readVarint(r *bufio.Reader) (int, error) {
	n, mul := 0, 1
	for i := 0; i < 4; i++ {
		c, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		n += int(c&0x7f) * mul
		if c&0x80 == 0 {
			return n, nil
		}
		mul *= 128
	}
	return 0, errors.New("malformed remaining length")
}

func dialRaw(cfg ClientConfig) (*rawClient, error) {
	conn, err := net.DialTimeout("tcp", cfg.Addr, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	win := cfg.Window
	if win <= 0 {
		win = 1
	}
	c := &rawClient{
		conn:     conn,
		r:        bufio.NewReaderSize(conn, 256*1024),
		w:        bufio.NewWriterSize(conn, 64*1024),
		deadline: cfg.Deadline,
		window:   int64(win),
		lowWater: int64(win - (win+3)/4), // refill in batches of ~1/4 window
		wake:     make(chan struct{}, 1),
		subWait:  make(chan byte, 1),
		done:     make(chan struct{}),
	}
	_ = conn.SetWriteDeadline(cfg.Deadline)

	// Keepalive 120 s: runs are bounded well below that, so no PINGREQ is ever needed.
	if _, err := conn.Write(connectPacket(cfg.ClientID, 120)); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(cfg.Timeout))
	hdr, err := c.r.ReadByte()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("reading CONNACK: %w", err)
	}
	rl, err := readVarint(c.r)
	if err != nil || hdr>>4 != pktConnack || rl != 2 {
		conn.Close()
		return nil, fmt.Errorf("bad CONNACK (header 0x%02x len %d err %v)", hdr, rl, err)
	}
	var body [2]byte
	if _, err := io.ReadFull(c.r, body[:]); err != nil {
		conn.Close()
		return nil, err
	}
	if body[1] != 0 {
		conn.Close()
		return nil, fmt.Errorf("CONNACK refused, return code %d", body[1])
	}
	_ = conn.SetReadDeadline(cfg.Deadline)
	go c.readLoop()
	return c, nil
}

func (c *rawClient) setErr(err error) {
	if err == nil || c.closed.Load() {
		return
	}
	c.errOnce.Do(func() { c.err.Store(&err) })
}

func (c *rawClient) Err() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *rawClient) readLoop() {
	defer close(c.done)
	buf := make([]byte, 64*1024)
	dirty := false // PUBACKs written but not flushed yet
	for {
		hdr, err := c.r.ReadByte()
		if err != nil {
			c.setErr(err)
			return
		}
		rl, err := readVarint(c.r)
		if err != nil {
			c.setErr(err)
			return
		}
		if rl > len(buf) {
			buf = make([]byte, rl)
		}
		body := buf[:rl]
		if _, err := io.ReadFull(c.r, body); err != nil {
			c.setErr(err)
			return
		}
		switch hdr >> 4 {
		case pktPublish:
			if len(body) < 2 {
				c.setErr(errors.New("short PUBLISH"))
				return
			}
			qos := (hdr >> 1) & 3
			off := 2 + int(binary.BigEndian.Uint16(body))
			if qos > 0 {
				if off+2 > len(body) {
					c.setErr(errors.New("short PUBLISH"))
					return
				}
				c.wmu.Lock()
				_, err = c.w.Write([]byte{pktPuback << 4, 2, body[off], body[off+1]})
				c.wmu.Unlock()
				if err != nil {
					c.setErr(err)
					return
				}
				dirty = true
				off += 2
			}
			if off > len(body) {
				c.setErr(errors.New("short PUBLISH"))
				return
			}
			if h := c.handler.Load(); h != nil {
				(*h)(body[off:])
			}
		case pktPuback:
			c.acked.Add(1)
			if n := c.inflight.Add(-1); n <= c.lowWater && c.waiting.Load() {
				select {
				case c.wake <- struct{}{}:
				default:
				}
			}
		case pktSuback:
			code := byte(0x80)
			if len(body) >= 3 {
				code = body[2]
			}
			select {
			case c.subWait <- code:
			default:
			}
		case pktPingresp:
		default:
			c.setErr(fmt.Errorf("unexpected packet type %d", hdr>>4))
			return
		}
		// Flush acknowledgements once we have drained what the kernel gave
		// us, so that PUBACKs are batched under load but never delayed.
		if dirty && c.r.Buffered() == 0 {
			if err := c.Flush(); err != nil {
				c.setErr(err)
				return
			}
			dirty = false
		}
	}
}

func (c *rawClient) Subscribe(topic string, qos byte, h MsgHandler, timeout time.Duration) error {
	c.handler.Store(&h)
	vh := binary.BigEndian.AppendUint16(nil, 1)
	vh = appendString(vh, topic)
	vh = append(vh, qos)
	pkt := append([]byte{pktSubscribe<<4 | 0x02}, appendVarint(nil, len(vh))...)
	pkt = append(pkt, vh...)
	c.wmu.Lock()
	_, err := c.w.Write(pkt)
	if err == nil {
		err = c.w.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		return err
	}
	select {
	case code := <-c.subWait:
		if code > 2 {
			return fmt.Errorf("SUBACK refused (0x%02x)", code)
		}
		return nil
	case <-c.done:
		return fmt.Errorf("connection closed before SUBACK: %v", c.Err())
	case <-time.After(timeout):
		return errors.New("timed out waiting for SUBACK")
	}
}

func (c *rawClient) Publish(topic string, qos byte, payload []byte, flush bool) error {
	var pid uint16
	if qos > 0 {
		// At most `window` unacknowledged publishes. When the window is
		// full, flush and wait until it has drained to the low-water mark
		// (3/4 of the window), so refills go out in batches rather than one
		// tiny write per PUBACK.
		if c.inflight.Load() >= c.window {
			if err := c.waitWindow(); err != nil {
				return err
			}
		}
		c.inflight.Add(1)
		c.nextID++
		if c.nextID == 0 {
			c.nextID = 1
		}
		pid = c.nextID
	}
	rl := 2 + len(topic) + len(payload)
	if qos > 0 {
		rl += 2
	}
	var hb [16]byte
	h := append(hb[:0], pktPublish<<4|qos<<1)
	h = appendVarint(h, rl)
	h = binary.BigEndian.AppendUint16(h, uint16(len(topic)))
	c.wmu.Lock()
	_, err := c.w.Write(h)
	if err == nil {
		_, err = c.w.WriteString(topic)
	}
	if err == nil && qos > 0 {
		_, err = c.w.Write([]byte{byte(pid >> 8), byte(pid)})
	}
	if err == nil {
		_, err = c.w.Write(payload)
	}
	if err == nil && flush {
		err = c.w.Flush()
	}
	c.wmu.Unlock()
	if err == nil && qos > 0 {
		c.sent1.Add(1)
	}
	return err
}

func (c *rawClient) waitWindow() error {
	if err := c.Flush(); err != nil {
		return err
	}
	wait := time.Until(c.deadline)
	if wait <= 0 {
		return errors.New("deadline reached waiting for in-flight window")
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	c.waiting.Store(true)
	defer c.waiting.Store(false)
	for c.inflight.Load() > c.lowWater {
		select {
		case <-c.wake:
		case <-c.done:
			return fmt.Errorf("connection closed: %v", c.Err())
		case <-t.C:
			return errors.New("deadline reached waiting for in-flight window")
		}
	}
	return nil
}

func (c *rawClient) Flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.Flush()
}

func (c *rawClient) Acked() int64 { return c.acked.Load() }

func (c *rawClient) WaitAcked(deadline time.Time) error {
	if err := c.Flush(); err != nil {
		return err
	}
	for c.acked.Load() < c.sent1.Load() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out with %d of %d PUBACKs", c.acked.Load(), c.sent1.Load())
		}
		select {
		case <-c.done:
			return fmt.Errorf("connection closed with %d of %d PUBACKs: %v",
				c.acked.Load(), c.sent1.Load(), c.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

func (c *rawClient) Close() {
	if c.closed.Swap(true) {
		return
	}
	c.wmu.Lock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.w.Write([]byte{pktDisconn << 4, 0})
	_ = c.w.Flush()
	c.wmu.Unlock()
	_ = c.conn.Close()
	select {
	case <-c.done:
	case <-time.After(2 * time.Second):
	}
}
