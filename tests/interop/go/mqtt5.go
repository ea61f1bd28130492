package main

// MQTT 5.0 through paho.golang: its paho client for one connection, its autopaho connection
// manager when the library is to reconnect by itself.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// packetTimeout is paho's own bound on waiting for an acknowledgement. Each command's context
// bounds it already; paho's default of 10 s would cut a longer timeout_ms short.
const packetTimeout = 10 * time.Minute

// v5api is what a paho.Client and an autopaho.ConnectionManager have in common.
type v5api interface {
	Subscribe(context.Context, *paho.Subscribe) (*paho.Suback, error)
	Unsubscribe(context.Context, *paho.Unsubscribe) (*paho.Unsuback, error)
	Publish(context.Context, *paho.Publish) (*paho.PublishResponse, error)
}

type v5connection struct {
	api     v5api
	link    *link
	out     *output
	timeout time.Duration // of one network connect

	current  atomic.Pointer[net.Conn] // the latest network connection
	outbound aliases                  // topic aliases this client sent, on current
	inbound  aliases                  // topic aliases the server sent, per paho client

	// stop ends the connection, with a DISCONNECT when graceful.
	stop func(ctx context.Context, graceful bool) error
}

func connectV5(ctx context.Context, cmd *command, out *output) (connection, bool, error) {
	host, err := cmd.host()
	if err != nil {
		return nil, false, err
	}
	c := &v5connection{link: newLink(out), out: out, timeout: cmd.timeout()}
	if cmd.Reconnect {
		return c.connectManaged(ctx, cmd, host)
	}
	return c.connectOnce(ctx, cmd, host)
}

// connectOnce connects one paho client, which does not reconnect.
func (c *v5connection) connectOnce(ctx context.Context, cmd *command, host string) (connection, bool, error) {
	conn, err := c.dial(ctx, host)
	if err != nil {
		return nil, false, err
	}
	config := c.clientConfig(cmd)
	config.Conn = conn
	client := paho.NewClient(config)
	connack, err := client.Connect(ctx, connectPacket(cmd))
	if err != nil {
		if connack != nil && connack.ReasonCode >= 0x80 {
			return nil, false, refused(connack)
		}
		return nil, false, err
	}
	c.api = client
	c.stop = func(ctx context.Context, graceful bool) error {
		if graceful {
			return bounded(ctx, func() error { return client.Disconnect(&paho.Disconnect{ReasonCode: 0}) })
		}
		// paho's only other way out is TerminateConnectionForTest: close the socket ourselves.
		closeConn(conn)
		return bounded(ctx, func() error { <-client.Done(); return nil })
	}
	return c, connack.SessionPresent, nil
}

// connectManaged connects through autopaho, which reconnects by itself. Its first attempt is the
// connect's result; autopaho would retry a refused one for ever, so that ends it.
func (c *v5connection) connectManaged(ctx context.Context, cmd *command, host string) (connection, bool, error) {
	server := &url.URL{Scheme: "mqtt", Host: host}
	first := make(chan *paho.Connack, 1)
	failed := make(chan error, 1)
	var connections atomic.Int32
	var dropping atomic.Bool
	config := autopaho.ClientConfig{
		ServerUrls:       []*url.URL{server},
		ReconnectBackoff: reconnectBackoff,
		ConnectTimeout:   c.timeout,
		AttemptConnection: func(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
			return c.dial(ctx, u.Host)
		},
		// The same CONNECT every time: autopaho would clear Clean Start after the first
		// connection, the README asks for the same clean on each reconnect.
		ConnectPacketBuilder: func(*paho.Connect, *url.URL) (*paho.Connect, error) { return connectPacket(cmd), nil },
		DisconnectPacketBuilder: func() *paho.Disconnect {
			if dropping.Load() {
				return nil
			}
			return &paho.Disconnect{ReasonCode: 0}
		},
		OnConnectionUp: func(_ *autopaho.ConnectionManager, connack *paho.Connack) {
			if connections.Add(1) == 1 {
				first <- connack
				return
			}
			go c.link.reconnected(connack.SessionPresent) // this callback must not block
		},
		OnConnectError: func(err error) {
			if connections.Load() == 0 {
				select {
				case failed <- err:
				default:
				}
			}
			log.Printf("connect attempt failed: %v", err)
		},
		ClientConfig: c.clientConfig(cmd),
	}
	manager, err := autopaho.NewConnection(context.Background(), config)
	if err != nil {
		return nil, false, err
	}
	c.api = manager
	c.stop = func(ctx context.Context, graceful bool) error {
		dropping.Store(!graceful)
		err := manager.Disconnect(ctx)
		if !graceful {
			// Without a DISCONNECT to send, autopaho leaves the socket open.
			if conn := c.current.Load(); conn != nil {
				closeConn(*conn)
			}
		}
		return err
	}
	select {
	case connack := <-first:
		return c, connack.SessionPresent, nil
	case err = <-failed:
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.link.silence()
	stopCtx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if stopErr := c.stop(stopCtx, false); stopErr != nil {
		log.Printf("stopping autopaho: %v", stopErr)
	}
	var connackErr *autopaho.ConnackError
	if errors.As(err, &connackErr) {
		return nil, false, fmt.Errorf("connect refused: reason code 0x%02x %s", connackErr.ReasonCode, connackErr.Reason)
	}
	return nil, false, err
}

// reconnectBackoff is autopaho's wait before attempt N after a loss (and before the first
// connection): none before the first, as paho.mqtt.golang, then a short one.
func reconnectBackoff(attempt int) time.Duration {
	if attempt == 0 {
		return 0
	}
	return reconnectDelay
}

// clientConfig is what a paho client needs besides its connection.
func (c *v5connection) clientConfig(cmd *command) paho.ClientConfig {
	return paho.ClientConfig{
		ClientID: *cmd.ClientID,
		// Made here so that autopaho keeps one across reconnections: QoS 1 and 2 exchanges in
		// flight resume on the next connection of a session the server kept.
		Session:           state.NewInMemory(),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){c.onPublish},
		OnClientError:     c.link.connectionLost,
		OnServerDisconnect: func(d *paho.Disconnect) {
			c.link.connectionLost(fmt.Errorf("the server sent DISCONNECT, reason code 0x%02x", d.ReasonCode))
		},
		PacketTimeout: packetTimeout,
	}
}

func connectPacket(cmd *command) *paho.Connect {
	connect := &paho.Connect{
		ClientID:   *cmd.ClientID,
		KeepAlive:  cmd.keepAlive(),
		CleanStart: cmd.clean(),
		Properties: &paho.ConnectProperties{},
	}
	if cmd.SessionExpiry > 0 {
		connect.Properties.SessionExpiryInterval = &cmd.SessionExpiry
	}
	if cmd.TopicAliasMaximum > 0 {
		connect.Properties.TopicAliasMaximum = &cmd.TopicAliasMaximum
	}
	if cmd.Username != nil {
		connect.UsernameFlag, connect.Username = true, *cmd.Username
	}
	if cmd.Password != nil {
		connect.PasswordFlag, connect.Password = true, []byte(*cmd.Password)
	}
	return connect
}

func (c *v5connection) dial(ctx context.Context, host string) (net.Conn, error) {
	dialer := net.Dialer{Timeout: c.timeout}
	conn, err := dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	c.current.Store(&conn)
	return conn, nil
}

func refused(connack *paho.Connack) error {
	reason := ""
	if connack.Properties != nil {
		reason = connack.Properties.ReasonString
	}
	return fmt.Errorf("connect refused: reason code 0x%02x %s", connack.ReasonCode, reason)
}

func (c *v5connection) onPublish(received paho.PublishReceived) (bool, error) {
	p := received.Packet
	c.out.send(message{
		Event:      "message",
		Topic:      c.inbound.resolve(received.Client, p),
		Payload:    string(p.Payload),
		QoS:        p.QoS,
		Retain:     p.Retain,
		Properties: receivedProperties(p.Properties),
	})
	return true, nil
}

func (c *v5connection) subscribe(ctx context.Context, cmd *command) ([]int, error) {
	subscribe := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: cmd.Filter, QoS: cmd.QoS}}}
	if cmd.SubscriptionID != nil {
		subscribe.Properties = &paho.SubscribeProperties{SubscriptionIdentifier: cmd.SubscriptionID}
	}
	suback, err := c.api.Subscribe(ctx, subscribe)
	// paho makes a refusing SUBACK an error; its codes are the result all the same.
	if suback == nil {
		return nil, err
	}
	granted := make([]int, len(suback.Reasons))
	for i, code := range suback.Reasons {
		granted[i] = int(code)
	}
	return granted, nil
}

func (c *v5connection) unsubscribe(ctx context.Context, filter string) error {
	_, err := c.api.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}})
	return err
}

func (c *v5connection) publish(ctx context.Context, cmd *command) error {
	p := &paho.Publish{QoS: cmd.QoS, Retain: cmd.Retain, Topic: cmd.Topic, Payload: []byte(cmd.Payload)}
	properties, err := sentProperties(cmd.Properties)
	if err != nil {
		return err
	}
	p.Properties = properties
	if properties.TopicAlias != nil {
		// paho sends what it is given, an empty topic with an alias included.
		p.Topic = c.outbound.use(c.current.Load(), *properties.TopicAlias, cmd.Topic)
	}
	response, err := c.api.Publish(ctx, p)
	// paho reports a refusing PUBREC as a success: the code decides.
	if response != nil && response.ReasonCode >= 0x80 {
		return fmt.Errorf("publish refused: reason code 0x%02x", response.ReasonCode)
	}
	return err
}

func (c *v5connection) disconnect(ctx context.Context) error {
	c.link.silence()
	return c.stop(ctx, true)
}

func (c *v5connection) drop(ctx context.Context) error {
	c.link.silence()
	return c.stop(ctx, false)
}

// aliases maps topic aliases to topics for one network connection, the scope of an alias.
type aliases struct {
	mu     sync.Mutex
	owner  any // the connection the topics were set on: its *net.Conn, or its *paho.Client
	topics map[uint16]string
}

// use gives the topic to send with alias: empty once the alias stands for it on this connection.
func (a *aliases) use(owner any, alias uint16, topic string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reset(owner)
	if a.topics[alias] == topic {
		return ""
	}
	a.topics[alias] = topic
	return topic
}

// resolve gives a received message's full topic: paho hands on the packet as it came, an empty
// topic with an alias included (only its StandardRouter, not used here, keeps aliases).
func (a *aliases) resolve(owner any, p *paho.Publish) string {
	if p.Properties == nil || p.Properties.TopicAlias == nil {
		return p.Topic
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reset(owner)
	if p.Topic != "" {
		a.topics[*p.Properties.TopicAlias] = p.Topic
		return p.Topic
	}
	return a.topics[*p.Properties.TopicAlias]
}

func (a *aliases) reset(owner any) {
	if a.owner != owner || a.topics == nil {
		a.owner, a.topics = owner, map[uint16]string{}
	}
}

// bounded runs f, giving up waiting for it when ctx ends.
func bounded(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
