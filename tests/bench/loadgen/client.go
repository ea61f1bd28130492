package main

import (
	"fmt"
	"time"
)

// MsgHandler is called for every PUBLISH a subscriber receives. The payload
// slice is only valid for the duration of the call.
type MsgHandler func(payload []byte)

// Client is the small surface the scenarios need. Two implementations exist:
// rawClient (a minimal hand-written MQTT 3.1.1 / 5.0 client) and pahoClient (a thin
// wrapper around github.com/eclipse/paho.mqtt.golang, which speaks 3.1.1 only).
type Client interface {
	// Subscribe subscribes to one topic filter and waits for the SUBACK.
	Subscribe(topic string, qos byte, h MsgHandler, timeout time.Duration) error
	// Publish sends one message. For QoS 1 and 2 it blocks while the in-flight
	// window is full. flush asks the client to push the bytes to the socket
	// now (latency mode) instead of letting them batch (throughput mode).
	// payload may be reused by the caller after Publish returns.
	Publish(topic string, qos byte, payload []byte, flush bool) error
	// Flush pushes any buffered outgoing bytes to the socket.
	Flush() error
	// WaitAcked waits until every QoS 1/2 publish sent so far was acknowledged.
	WaitAcked(deadline time.Time) error
	// Acked returns the number of PUBACKs (QoS 2: PUBCOMPs) received so far.
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
	Protocol byte // 4: MQTT 3.1.1 (default), 5: MQTT 5.0 (raw only)
	PubProps bool // 5.0: a Content Type and a User Property on every PUBLISH
	// 5.0: the Receive Maximum in CONNECT (QoS 1/2 messages the server may have
	// unacknowledged towards this client); 0: none sent (65535)
	ReceiveMax int
	Window     int           // max QoS 1/2 publishes in flight (publisher side)
	Deadline   time.Time     // hard deadline for all network I/O
	Timeout    time.Duration // connect timeout
}

func NewClient(cfg ClientConfig) (Client, error) {
	switch cfg.Kind {
	case "raw":
		return dialRaw(cfg)
	case "paho":
		if cfg.Protocol == 5 {
			// paho.mqtt.golang implements MQTT 3.1 and 3.1.1 only (its 5.0 client is a
			// different module, github.com/eclipse/paho.golang, with another API).
			return nil, fmt.Errorf("-client paho speaks MQTT 3.1.1 only; use -client raw for -protocol 5")
		}
		return dialPaho(cfg)
	default:
		return nil, fmt.Errorf("unknown client kind %q (want raw or paho)", cfg.Kind)
	}
}
