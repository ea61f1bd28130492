package main

// MQTT 3.1.1 through paho.mqtt.golang.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// v4conn is one network connection the library asked for. The driver opens it itself to be able
// to drop it without a DISCONNECT (paho.mqtt.golang has no call for that), and to read the
// CONNACK's session-present flag: the library keeps it in the connect token of the first
// connection but drops it after a reconnect of its own.
type v4conn struct {
	net.Conn
	mu   sync.Mutex
	head []byte // the first bytes read: a CONNACK is 0x20 0x02 flags code
}

func (c *v4conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if missing := 4 - len(c.head); missing > 0 {
		c.head = append(c.head, p[:min(n, missing)]...)
	}
	c.mu.Unlock()
	return n, err
}

func (c *v4conn) sessionPresent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.head) == 4 && c.head[0] == 0x20 && c.head[2]&1 == 1
}

type v4connection struct {
	client  mqtt.Client
	link    *link
	out     *output
	timeout time.Duration // of one network connect

	current  atomic.Pointer[v4conn] // the latest network connection
	dropped  atomic.Bool            // close was asked: no new network connection
	connects atomic.Int32           // connections the library reported up
}

func connectV4(ctx context.Context, cmd *command, out *output) (connection, bool, error) {
	if cmd.SessionExpiry != 0 || cmd.TopicAliasMaximum != 0 {
		return nil, false, errors.New("fields 'session_expiry' and 'topic_alias_maximum' are MQTT 5.0 only")
	}
	host, err := cmd.host()
	if err != nil {
		return nil, false, err
	}
	c := &v4connection{link: newLink(out), out: out, timeout: cmd.timeout()}
	c.client = mqtt.NewClient(c.options(cmd, host))
	token := c.client.Connect()
	if err := wait(ctx, token); err != nil {
		connectToken := token.(*mqtt.ConnectToken)
		if ctx.Err() != nil {
			// The attempt goes on for at most its connect timeout: stop what it may still bring up.
			go func() { token.Wait(); c.client.Disconnect(0) }()
			return nil, false, err
		}
		if code := connectToken.ReturnCode(); code < packets.ErrNetworkError { // a CONNACK's code
			return nil, false, fmt.Errorf("connect refused: %v (return code %d)", err, code)
		}
		return nil, false, err
	}
	return c, token.(*mqtt.ConnectToken).SessionPresent(), nil
}

func (c *v4connection) options(cmd *command, host string) *mqtt.ClientOptions {
	opts := mqtt.NewClientOptions().
		AddBroker("tcp://" + host).
		SetClientID(*cmd.ClientID).
		SetProtocolVersion(4). // no fallback to 3.1 on a refused CONNECT
		SetCleanSession(cmd.clean()).
		SetKeepAlive(time.Duration(cmd.keepAlive()) * time.Second).
		SetConnectTimeout(c.timeout).
		SetCustomOpenConnectionFn(c.open).
		// A refused first CONNECT is the connect's result, not something to retry.
		SetConnectRetry(false).
		SetAutoReconnect(cmd.Reconnect).
		// The library reconnects at once after a loss, then after failed attempts waits
		// 1 s doubling up to this maximum: keep every wait short.
		SetMaxReconnectInterval(reconnectDelay).
		// The session, subscriptions included, is the server's: no resubscribing.
		SetResumeSubs(false).
		// Messages in the order they came; the handler only writes a line, so never blocks long.
		SetOrderMatters(true).
		SetDefaultPublishHandler(c.onMessage).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) { c.link.connectionLost(err) }).
		SetOnConnectHandler(c.onConnect)
	if cmd.Username != nil {
		opts.SetUsername(*cmd.Username)
	}
	if cmd.Password != nil {
		opts.SetPassword(*cmd.Password)
	}
	return opts
}

func (c *v4connection) open(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
	if c.dropped.Load() {
		return nil, errors.New("the driver closed this connection")
	}
	raw, err := net.DialTimeout("tcp", uri.Host, c.timeout)
	if err != nil {
		return nil, err
	}
	conn := &v4conn{Conn: raw}
	c.current.Store(conn)
	return conn, nil
}

// onConnect is the library's callback for every connection up, the first one included (that one
// is connect's result).
func (c *v4connection) onConnect(mqtt.Client) {
	if c.connects.Add(1) == 1 {
		return
	}
	if conn := c.current.Load(); conn != nil {
		c.link.reconnected(conn.sessionPresent())
	}
}

func (c *v4connection) onMessage(_ mqtt.Client, m mqtt.Message) {
	c.out.send(message{
		Event: "message", Topic: m.Topic(), Payload: string(m.Payload()), QoS: m.Qos(), Retain: m.Retained(),
	})
}

func (c *v4connection) subscribe(ctx context.Context, cmd *command) ([]int, error) {
	if cmd.SubscriptionID != nil {
		return nil, errors.New("field 'subscription_id' is MQTT 5.0 only")
	}
	// No callback of its own: messages go to the default handler.
	token := c.client.Subscribe(cmd.Filter, cmd.QoS, nil)
	if err := wait(ctx, token); err != nil {
		return nil, err
	}
	// One filter, one code; the library keys it by the filter less a $share/GROUP/ prefix.
	for _, code := range token.(*mqtt.SubscribeToken).Result() {
		return []int{int(code)}, nil
	}
	return nil, fmt.Errorf("the SUBACK has no return code for %q", cmd.Filter)
}

func (c *v4connection) unsubscribe(ctx context.Context, filter string) error {
	return wait(ctx, c.client.Unsubscribe(filter))
}

func (c *v4connection) publish(ctx context.Context, cmd *command) error {
	if cmd.Properties != nil {
		return errors.New("field 'properties' is MQTT 5.0 only")
	}
	return wait(ctx, c.client.Publish(cmd.Topic, cmd.QoS, cmd.Retain, []byte(cmd.Payload)))
}

func (c *v4connection) disconnect(ctx context.Context) error {
	c.link.silence()
	quiesce := time.Second
	if deadline, ok := ctx.Deadline(); ok {
		quiesce = max(0, min(quiesce, time.Until(deadline)))
	}
	// Returns once the DISCONNECT is written and the connection closed, or after quiesce.
	c.client.Disconnect(uint(quiesce.Milliseconds()))
	return nil
}

func (c *v4connection) drop(context.Context) error {
	c.link.silence()
	c.dropped.Store(true)
	if conn := c.current.Load(); conn != nil {
		closeConn(conn)
	}
	// The socket is closed, so no DISCONNECT can reach the server; this stops the library's
	// reconnect, if on, and its workers.
	c.client.Disconnect(0)
	return nil
}

// wait waits for a token within ctx and returns its error.
func wait(ctx context.Context, token mqtt.Token) error {
	select {
	case <-token.Done():
		return token.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}
