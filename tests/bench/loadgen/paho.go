package main

// Thin adapter around github.com/eclipse/paho.mqtt.golang. Paho has no limit
// on QoS 1 publishes in flight, so the adapter keeps a ring of the last
// `Window` publish tokens and waits for the oldest before sending when the
// ring is full (a bounded window of unacknowledged publishes).

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

type pahoClient struct {
	c        mqtt.Client
	deadline time.Time
	window   int
	ring     []mqtt.Token // publisher goroutine only
	acked    atomic.Int64
	lost     atomic.Pointer[error]
}

func dialPaho(cfg ClientConfig) (*pahoClient, error) {
	p := &pahoClient{deadline: cfg.Deadline, window: cfg.Window}
	if p.window <= 0 {
		p.window = 1
	}
	opts := mqtt.NewClientOptions().
		AddBroker("tcp://" + cfg.Addr).
		SetClientID(cfg.ClientID).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetResumeSubs(false).
		SetKeepAlive(120 * time.Second).
		SetConnectTimeout(cfg.Timeout).
		SetWriteTimeout(time.Until(cfg.Deadline)).
		SetOrderMatters(true). // handler runs inline; ours is tiny and never blocks
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			p.lost.CompareAndSwap(nil, &err)
		})
	p.c = mqtt.NewClient(opts)
	tok := p.c.Connect()
	if !tok.WaitTimeout(cfg.Timeout) {
		return nil, errors.New("paho: connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, fmt.Errorf("paho: connect: %w", err)
	}
	return p, nil
}

func (p *pahoClient) Subscribe(topic string, qos byte, h MsgHandler, timeout time.Duration) error {
	tok := p.c.Subscribe(topic, qos, func(_ mqtt.Client, m mqtt.Message) {
		h(m.Payload())
	})
	if !tok.WaitTimeout(timeout) {
		return errors.New("paho: timed out waiting for SUBACK")
	}
	if err := tok.Error(); err != nil {
		return err
	}
	if st, ok := tok.(*mqtt.SubscribeToken); ok {
		for _, code := range st.Result() {
			if code > 2 {
				return fmt.Errorf("paho: SUBACK refused (0x%02x)", code)
			}
		}
	}
	return nil
}

func (p *pahoClient) waitToken(t mqtt.Token) error {
	wait := time.Until(p.deadline)
	if wait <= 0 || !t.WaitTimeout(wait) {
		return errors.New("paho: deadline reached waiting for PUBACK")
	}
	if err := t.Error(); err != nil {
		return err
	}
	p.acked.Add(1)
	return nil
}

func (p *pahoClient) Publish(topic string, qos byte, payload []byte, _ bool) error {
	if qos > 0 && len(p.ring) >= p.window {
		oldest := p.ring[0]
		p.ring = p.ring[1:]
		if err := p.waitToken(oldest); err != nil {
			return err
		}
	}
	// paho keeps a reference to the payload until it is written, and our
	// callers reuse their buffer, so hand it a copy.
	buf := make([]byte, len(payload))
	copy(buf, payload)
	tok := p.c.Publish(topic, qos, false, buf)
	if qos > 0 {
		p.ring = append(p.ring, tok)
		return nil
	}
	// QoS 0 tokens complete once the packet is handed to the network; only
	// look at them if they already failed.
	select {
	case <-tok.Done():
		return tok.Error()
	default:
		return nil
	}
}

func (p *pahoClient) Flush() error { return nil }

func (p *pahoClient) WaitAcked(deadline time.Time) error {
	for len(p.ring) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("paho: %d PUBACKs still missing", len(p.ring))
		}
		t := p.ring[0]
		p.ring = p.ring[1:]
		if err := p.waitToken(t); err != nil {
			return err
		}
	}
	return nil
}

func (p *pahoClient) Acked() int64 { return p.acked.Load() }

func (p *pahoClient) Err() error {
	if e := p.lost.Load(); e != nil {
		return *e
	}
	return nil
}

func (p *pahoClient) Close() {
	p.c.Disconnect(100)
}
