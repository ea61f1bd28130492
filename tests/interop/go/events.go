package main

import (
	"errors"
	"sync"
	"time"
)

// lossWait bounds how long a reconnection waits for the report of the loss before it.
const lossWait = 2 * time.Second

// message is the "message" event; Properties is left out for MQTT 3.1.1.
type message struct {
	Event      string `json:"event"`
	Topic      string `json:"topic"`
	Payload    string `json:"payload"`
	QoS        byte   `json:"qos"`
	Retain     bool   `json:"retain"`
	Properties any    `json:"properties,omitempty"` // a map, present for MQTT 5.0 even when empty
}

// link turns a connection's loss and the library's own reconnection into the events
// connection_lost and reconnected, in that order. Both libraries call their loss and connect
// callbacks on goroutines of their own, so either may come first: a reconnection waits for the
// loss before it to be reported.
type link struct {
	out *output

	mu    sync.Mutex
	quiet bool          // the test ended the connection itself: nothing more to report
	lost  chan struct{} // closed once the loss of the current connection is reported
}

func newLink(out *output) *link {
	return &link{out: out, lost: make(chan struct{})}
}

// connectionLost reports the loss of the current connection, once however often it is called.
func (l *link) connectionLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.quiet || isClosed(l.lost) {
		return
	}
	close(l.lost)
	l.out.send(map[string]any{"event": "connection_lost", "error": err.Error()})
}

// reconnected reports a connection made by the library's own reconnect. It may block for
// lossWait, so callers whose callbacks must not block run it on a goroutine.
func (l *link) reconnected(sessionPresent bool) {
	l.mu.Lock()
	previous := l.lost
	l.mu.Unlock()
	select {
	case <-previous:
	case <-time.After(lossWait):
		l.connectionLost(errors.New("connection lost (the library reconnected before saying why)"))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.quiet {
		return
	}
	l.lost = make(chan struct{})
	l.out.send(map[string]any{"event": "reconnected", "session_present": sessionPresent})
}

// silence stops all reports: called before the test's own disconnect or close.
func (l *link) silence() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.quiet = true
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
