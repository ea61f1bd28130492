package main

import (
	"fmt"
	"time"
)

// MsgHandler is called for every PUBLISH a subscriber receives. The payload
// slice is only valid for the duration of the call.
type MsgHandler func(payload []byte)

// Client is the small surface the scenarios need. Two implementations exist:
// rawClient (a minimal hand-written MQTT 3.1.1 client) and pahoClient (a thin
// wrapper around github.com/eclipse/paho.mqtt.golang).
type Client interface {
	// Subscribe subscribes to one topic filter and waits for the SUBACK.
	Subscribe(topic string, qos byte, h MsgHandler, timeout time.Duration) error
	// Publish sends one message. For QoS 1 it blocks while the in-flight
	// window is full. flush asks the client to push the bytes to the socket
	// now (latency mode) instead of letting them batch (throughput mode).
	// payload may be reused by the caller after Publish returns.
	Publish(topic string, qos byte, payload []byte, flush bool) error
	// Flush pushes any buffered outgoing bytes to the socket.
	Flush() error
	// WaitAcked waits until every QoS 1 publish sent so far was acknowledged.
	WaitAcked(deadline time.Time) error
	// Acked returns the number of PUBACKs received so far.
	Acked() int64
	// Err returns the first connection error seen by the client, if any.
	Err() error
	Close()
}

// ClientConfig holds what is needed to connect.
type ClientConfig struct {
	Kind     string // "raw" or "paho"
	Addr     string // host:port
	ClientID string
	Window   int           // max QoS 1 publishes in flight (publisher side)
	Deadline time.Time     // hard deadline for all network I/O
	Timeout  time.Duration // connect timeout
}

func NewClient(cfg ClientConfig) (Client, error) {
	switch cfg.Kind {
	case "raw":
		return dialRaw(cfg)
	case "paho":
		return dialPaho(cfg)
	default:
		return nil, fmt.Errorf("unknown client kind %q (want raw or paho)", cfg.Kind)
	}
}
