package main

// A minimal MQTT 3.1.1 / 5.0 client written for this benchmark: CONNECT/CONNACK,
// SUBSCRIBE/SUBACK, PUBLISH at QoS 0, 1 and 2, PUBACK, PUBREC/PUBREL/PUBCOMP (both
// directions), DISCONNECT. It batches outgoing bytes in a bufio.Writer so that the load
// generator spends as little CPU per message as possible, leaving more of the (shared)
// cores to the broker under test.
//
// MQTT 5.0 (-protocol 5): CONNECT level 5 with an empty property block (Clean Start, no
// Session Expiry Interval: the session ends with the connection, as a 3.1.1 clean
// session); the CONNACK's properties are parsed, and its Receive Maximum caps the QoS 1/2
// window when it is smaller; PUBLISH carries an empty property block (with -props a
// Content Type and a User Property, see publishProps); the property block of every
// incoming PUBLISH is skipped; SUBSCRIBE has an empty property block and the options byte
// (QoS only); acknowledgements and DISCONNECT use the short forms 5.0 allows (packet id
// only, meaning Success; remaining length 0, meaning Normal disconnection). Reason codes
// >= 0x80 in incoming acknowledgements and a server's DISCONNECT are reported as errors.
// With -protocol 4 (the default) the bytes on the wire are those of 3.1.1.

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
	pktPubrec    = 5
	pktPubrel    = 6
	pktPubcomp   = 7
	pktSubscribe = 8
	pktSuback    = 9
	pktPingreq   = 12
	pktPingresp  = 13
	pktDisconn   = 14
	pktAuth      = 15
)

// MQTT 5.0 property identifiers the client reads or writes (MQTT 5.0, 2.2.2.2).
const (
	propContentType      = 0x03
	propReasonString     = 0x1F
	propReceiveMaximum   = 0x21
	propMaximumQoS       = 0x24
	propUserProperty     = 0x26
	propMaximumPacketSiz = 0x27
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
	inflight atomic.Int64 // QoS 1/2 publishes sent and not yet acked (PUBACK / PUBCOMP)
	waiting  atomic.Bool  // publisher is blocked on a full window
	wake     chan struct{}
	sent1    atomic.Int64 // QoS 1/2 publishes sent
	acked    atomic.Int64

	handler atomic.Pointer[MsgHandler]
	subWait chan byte // SUBACK return codes

	proto     byte         // 4: MQTT 3.1.1, 5: MQTT 5.0
	pubProps  []byte       // 5.0: the PUBLISH property block, its length first
	maxPacket int          // 5.0: the server's Maximum Packet Size (0: no limit)
	recvMax   int          // 5.0: the server's Receive Maximum (65535 when absent)
	maxQoS    int          // 5.0: the server's Maximum QoS (2 when absent)
	refused   atomic.Int64 // 5.0: PUBACKs / PUBRECs / PUBCOMPs with a reason code >= 0x80

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

// connect5Packet is an MQTT 5.0 CONNECT: protocol "MQTT" level 5, Clean Start, no will,
// no credentials, an empty property block (so no Session Expiry Interval: the session ends
// with the connection, no Topic Alias Maximum: the server sends no aliases), or with
// recvMax > 0 only a Receive Maximum (what libmosquitto's 5.0 clients send: 20).
func connect5Packet(clientID string, keepalive, recvMax int) []byte {
	vh := appendString(nil, "MQTT")
	vh = append(vh, 5, 0x02, byte(keepalive>>8), byte(keepalive))
	if recvMax > 0 {
		vh = append(vh, 3, propReceiveMaximum, byte(recvMax>>8), byte(recvMax))
	} else {
		vh = append(vh, 0)
	}
	vh = appendString(vh, clientID)
	pkt := append([]byte{pktConnect << 4}, appendVarint(nil, len(vh))...)
	return append(pkt, vh...)
}

// publishProps is the property block (its length first) of every 5.0 PUBLISH: empty, or
// with `meta` a Content Type and a User Property (the metadata a v5 application may add).
func publishProps(meta bool) []byte {
	if !meta {
		return []byte{0}
	}
	p := appendString([]byte{propContentType}, "application/octet-stream")
	p = append(p, propUserProperty)
	p = appendString(p, "source")
	p = appendString(p, "loadgen")
	return append(appendVarint(nil, len(p)), p...)
}

// sliceVarint decodes a Variable Byte Integer at the start of b: its value and length.
func sliceVarint(b []byte) (int, int, error) {
	n, mul := 0, 1
	for i := 0; i < 4 && i < len(b); i++ {
		n += int(b[i]&0x7f) * mul
		if b[i]&0x80 == 0 {
			return n, i + 1, nil
		}
		mul *= 128
	}
	return 0, 0, errors.New("malformed variable byte integer")
}

// propBlock splits b (starting with a property length) into the properties and the rest.
func propBlock(b []byte) ([]byte, []byte, error) {
	n, used, err := sliceVarint(b)
	if err != nil || used+n > len(b) {
		return nil, nil, errors.New("malformed property block")
	}
	return b[used : used+n], b[used+n:], nil
}

// walkProps calls fn with every property's identifier and raw value (strings and binary
// data with their 2-byte length, a string pair as both strings).
func walkProps(props []byte, fn func(id byte, v []byte)) error {
	for len(props) > 0 {
		id := props[0]
		props = props[1:]
		var size int
		switch id {
		case 0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A: // byte
			size = 1
		case 0x13, 0x21, 0x22, 0x23: // two-byte integer
			size = 2
		case 0x02, 0x11, 0x18, 0x27: // four-byte integer
			size = 4
		case 0x0B: // variable byte integer
			_, used, err := sliceVarint(props)
			if err != nil {
				return err
			}
			size = used
		case 0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1A, 0x1C, 0x1F: // string / binary
			if len(props) < 2 {
				return errors.New("short property")
			}
			size = 2 + int(binary.BigEndian.Uint16(props))
		case propUserProperty: // string pair
			if len(props) < 2 {
				return errors.New("short property")
			}
			k := 2 + int(binary.BigEndian.Uint16(props))
			if len(props) < k+2 {
				return errors.New("short property")
			}
			size = k + 2 + int(binary.BigEndian.Uint16(props[k:]))
		default:
			return fmt.Errorf("unknown property 0x%02x", id)
		}
		if size > len(props) {
			return errors.New("short property")
		}
		fn(id, props[:size])
		props = props[size:]
	}
	return nil
}

// reasonString is the Reason String of a property block, for error messages.
func reasonString(props []byte) string {
	s := ""
	_ = walkProps(props, func(id byte, v []byte) {
		if id == propReasonString {
			s = " (" + string(v[2:]) + ")"
		}
	})
	return s
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
	proto := cfg.Protocol
	if proto == 0 {
		proto = 4
	}
	c := &rawClient{
		proto:    proto,
		recvMax:  65535,
		maxQoS:   2,
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
	connect := connectPacket(cfg.ClientID, 120)
	if proto == 5 {
		connect = connect5Packet(cfg.ClientID, 120, cfg.ReceiveMax)
		c.pubProps = publishProps(cfg.PubProps)
	}
	if _, err := conn.Write(connect); err != nil {
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
	if proto == 5 {
		// Acknowledge flags, reason code, properties.
		if err != nil || hdr>>4 != pktConnack || rl < 3 || rl > 64*1024 {
			conn.Close()
			return nil, fmt.Errorf("bad CONNACK (header 0x%02x len %d err %v)", hdr, rl, err)
		}
		body := make([]byte, rl)
		if _, err := io.ReadFull(c.r, body); err != nil {
			conn.Close()
			return nil, err
		}
		props, _, err := propBlock(body[2:])
		if err == nil {
			err = walkProps(props, c.connackProp)
		}
		if body[1] != 0 {
			conn.Close()
			return nil, fmt.Errorf("CONNACK refused, reason code 0x%02x%s", body[1], reasonString(props))
		}
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("bad CONNACK properties: %v", err)
		}
		// The server's Receive Maximum bounds our unacknowledged QoS 1/2 publishes.
		if c.recvMax < win {
			c.window = int64(c.recvMax)
			c.lowWater = int64(c.recvMax - (c.recvMax+3)/4)
		}
	} else {
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
	}
	_ = conn.SetReadDeadline(cfg.Deadline)
	go c.readLoop()
	return c, nil
}

// connackProp records what a 5.0 CONNACK says that bounds this client.
func (c *rawClient) connackProp(id byte, v []byte) {
	switch id {
	case propReceiveMaximum:
		c.recvMax = int(binary.BigEndian.Uint16(v))
	case propMaximumPacketSiz:
		c.maxPacket = int(binary.BigEndian.Uint32(v))
	case propMaximumQoS:
		c.maxQoS = int(v[0])
	}
}

// Window is the most QoS 1/2 publishes this client has unacknowledged: the -window, or the
// server's smaller Receive Maximum (5.0).
func (c *rawClient) Window() int { return int(c.window) }

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
	dirty := false // acknowledgements written but not flushed yet
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
				// QoS 1: PUBACK; QoS 2: PUBREC (PUBCOMP follows the server's PUBREL). The
				// message is handed over at once: without reconnects there are no
				// duplicates to hold back.
				ack := byte(pktPuback << 4)
				if qos == 2 {
					ack = pktPubrec << 4
				}
				c.wmu.Lock()
				_, err = c.w.Write([]byte{ack, 2, body[off], body[off+1]})
				c.wmu.Unlock()
				if err != nil {
					c.setErr(err)
					return
				}
				dirty = true
				off += 2
			}
			if c.proto == 5 && off <= len(body) {
				n, used, err := sliceVarint(body[off:])
				if err != nil {
					c.setErr(fmt.Errorf("PUBLISH properties: %v", err))
					return
				}
				off += used + n
			}
			if off > len(body) {
				c.setErr(errors.New("short PUBLISH"))
				return
			}
			if h := c.handler.Load(); h != nil {
				(*h)(body[off:])
			}
		case pktPuback, pktPubcomp:
			// The end of a QoS 1 (PUBACK) or QoS 2 (PUBCOMP) publish.
			if c.proto == 5 && len(body) >= 3 && body[2] >= 0x80 {
				c.refusedAck(hdr>>4, body)
			}
			c.ackedOne()
		case pktPubrec:
			if len(body) < 2 {
				c.setErr(errors.New("short PUBREC"))
				return
			}
			if c.proto == 5 && len(body) >= 3 && body[2] >= 0x80 {
				// Refused: the flow ends here, no PUBREL (MQTT-4.3.3).
				c.refusedAck(pktPubrec, body)
				c.ackedOne()
				break
			}
			c.wmu.Lock()
			_, err = c.w.Write([]byte{pktPubrel<<4 | 0x02, 2, body[0], body[1]})
			c.wmu.Unlock()
			if err != nil {
				c.setErr(err)
				return
			}
			dirty = true
		case pktPubrel:
			if len(body) < 2 {
				c.setErr(errors.New("short PUBREL"))
				return
			}
			c.wmu.Lock()
			_, err = c.w.Write([]byte{pktPubcomp << 4, 2, body[0], body[1]})
			c.wmu.Unlock()
			if err != nil {
				c.setErr(err)
				return
			}
			dirty = true
		case pktSuback:
			code := byte(0x80)
			codes := body
			if len(codes) >= 2 {
				codes = codes[2:]
			}
			if c.proto == 5 {
				if _, rest, err := propBlock(codes); err == nil {
					codes = rest
				} else {
					codes = nil
				}
			}
			if len(body) >= 2 && len(codes) >= 1 {
				code = codes[0]
			}
			select {
			case c.subWait <- code:
			default:
			}
		case pktPingresp:
		case pktDisconn:
			// 5.0: the server closes the connection and says why.
			reason, why := byte(0), ""
			if len(body) >= 1 {
				reason = body[0]
			}
			if len(body) >= 2 {
				if props, _, err := propBlock(body[1:]); err == nil {
					why = reasonString(props)
				}
			}
			c.setErr(fmt.Errorf("server sent DISCONNECT, reason code 0x%02x%s", reason, why))
			return
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

// ackedOne counts a publish whose flow has ended and wakes the publisher if it waits for
// room in the window.
func (c *rawClient) ackedOne() {
	c.acked.Add(1)
	if n := c.inflight.Add(-1); n <= c.lowWater && c.waiting.Load() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// refusedAck records a 5.0 acknowledgement with a failure reason code (the first one as
// the connection's error, so that it is reported).
func (c *rawClient) refusedAck(kind byte, body []byte) {
	c.refused.Add(1)
	why := ""
	if len(body) > 3 {
		if props, _, err := propBlock(body[3:]); err == nil {
			why = reasonString(props)
		}
	}
	name := map[byte]string{pktPuback: "PUBACK", pktPubrec: "PUBREC", pktPubcomp: "PUBCOMP"}[kind]
	c.setErr(fmt.Errorf("%s for packet id %d with reason code 0x%02x%s",
		name, binary.BigEndian.Uint16(body), body[2], why))
}

// Refused is the number of 5.0 PUBACKs / PUBRECs / PUBCOMPs with a failure reason code.
func (c *rawClient) Refused() int64 { return c.refused.Load() }

// ServerReceiveMaximum is the Receive Maximum of the server's CONNACK (5.0; 65535 when it
// sent none), 0 for 3.1.1.
func (c *rawClient) ServerReceiveMaximum() int {
	if c.proto != 5 {
		return 0
	}
	return c.recvMax
}

func (c *rawClient) Subscribe(topic string, qos byte, h MsgHandler, timeout time.Duration) error {
	c.handler.Store(&h)
	vh := binary.BigEndian.AppendUint16(nil, 1)
	if c.proto == 5 {
		vh = append(vh, 0) // no properties
	}
	vh = appendString(vh, topic)
	// 3.1.1: the requested QoS; 5.0: the subscription options, of which only the QoS is set
	// (No Local, Retain As Published and Retain Handling 0).
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
	rl := 2 + len(topic) + len(payload)
	if qos > 0 {
		rl += 2
	}
	if c.proto == 5 {
		rl += len(c.pubProps)
		if int(qos) > c.maxQoS {
			return fmt.Errorf("QoS %d above the server's Maximum QoS %d", qos, c.maxQoS)
		}
		if c.maxPacket > 0 && 1+len(appendVarint(nil, rl))+rl > c.maxPacket {
			return fmt.Errorf("PUBLISH of %d bytes above the server's Maximum Packet Size %d",
				1+len(appendVarint(nil, rl))+rl, c.maxPacket)
		}
	}
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
	if err == nil && c.proto == 5 {
		_, err = c.w.Write(c.pubProps)
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
	// 3.1.1 DISCONNECT; in 5.0 the same two bytes mean Normal disconnection, no properties.
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
