// The Eclipse Paho Go driver of tests/interop: reads the JSON commands of tests/interop/README.md
// from stdin, one a line, turns them into calls of paho.mqtt.golang (MQTT 3.1.1) or paho.golang
// (MQTT 5.0) and writes their results and the libraries' events to stdout.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"os"
	"sync"
	"time"
)

const defaultTimeout = 10 * time.Second

// reconnectDelay spaces the libraries' reconnect attempts after the first one, which both make at
// once: the scenario kills a node and expects the client back through the balancer within about
// a second.
const reconnectDelay = 500 * time.Millisecond

// command is one line of stdin; each op reads the fields it needs.
type command struct {
	Op        string `json:"op"`
	ID        *int64 `json:"id"`
	TimeoutMS *int64 `json:"timeout_ms"`

	URL               string  `json:"url"`
	ClientID          *string `json:"client_id"`
	Version           int     `json:"version"`
	Clean             *bool   `json:"clean"`
	KeepAlive         *uint16 `json:"keepalive"`
	Reconnect         bool    `json:"reconnect"`
	SessionExpiry     uint32  `json:"session_expiry"`
	TopicAliasMaximum uint16  `json:"topic_alias_maximum"`
	Username          *string `json:"username"`
	Password          *string `json:"password"`

	Filter         string `json:"filter"`
	QoS            byte   `json:"qos"`
	SubscriptionID *int   `json:"subscription_id"`

	Topic      string             `json:"topic"`
	Payload    string             `json:"payload"`
	Retain     bool               `json:"retain"`
	Properties *publishProperties `json:"properties"`
}

// publishProperties are a publish's MQTT 5.0 properties (README, "publish").
type publishProperties struct {
	UserProperties  [][]string `json:"user_properties"`
	ResponseTopic   *string    `json:"response_topic"`
	CorrelationData *string    `json:"correlation_data"`
	ContentType     *string    `json:"content_type"`
	PayloadFormat   *byte      `json:"payload_format"`
	MessageExpiry   *uint32    `json:"message_expiry"`
	TopicAlias      *uint16    `json:"topic_alias"`
}

// UnmarshalJSON refuses unknown keys: a misspelt property would otherwise silently not be sent.
func (p *publishProperties) UnmarshalJSON(data []byte) error {
	type plain publishProperties
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.DisallowUnknownFields()
	err := decoder.Decode((*plain)(p))
	var typeErr *json.UnmarshalTypeError
	if err != nil && !errors.As(err, &typeErr) { // json names the field of a type error itself
		return fmt.Errorf("field 'properties': %v", err)
	}
	return err
}

func (c *command) clean() bool {
	return c.Clean == nil || *c.Clean
}

func (c *command) keepAlive() uint16 {
	if c.KeepAlive == nil {
		return 30
	}
	return *c.KeepAlive
}

func (c *command) timeout() time.Duration {
	if c.TimeoutMS == nil || *c.TimeoutMS <= 0 {
		return defaultTimeout
	}
	return time.Duration(*c.TimeoutMS) * time.Millisecond
}

// host is the HOST:PORT of an mqtt:// url: both libraries are driven over TCP only.
func (c *command) host() (string, error) {
	u, err := url.Parse(c.URL)
	if err != nil || u.Scheme != "mqtt" || u.Host == "" {
		return "", fmt.Errorf("field 'url' must be mqtt://HOST:PORT (this driver speaks TCP only), got %q", c.URL)
	}
	return u.Host, nil
}

func (c *command) checkQoS() error {
	if c.QoS > 2 {
		return fmt.Errorf("field 'qos' must be 0, 1 or 2, got %d", c.QoS)
	}
	return nil
}

// connection is one connect's MQTT connection, of either library.
type connection interface {
	subscribe(ctx context.Context, cmd *command) (granted []int, err error)
	unsubscribe(ctx context.Context, filter string) error
	publish(ctx context.Context, cmd *command) error
	// disconnect sends DISCONNECT and closes; drop closes without one and stops any reconnect.
	// Neither reports connection_lost.
	disconnect(ctx context.Context) error
	drop(ctx context.Context) error
}

// closeConn closes a network connection the library may have closed already.
func closeConn(conn net.Conn) {
	if err := conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		log.Printf("closing the connection: %v", err)
	}
}

// output writes the lines of stdout, one whole line per write, from any goroutine.
type output struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *output) send(line any) {
	data, err := json.Marshal(line)
	if err != nil {
		log.Printf("cannot encode %#v: %v", line, err)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := o.w.Write(append(data, '\n')); err != nil {
		log.Printf("cannot write to stdout: %v", err)
	}
}

type result map[string]any

type driver struct {
	out  *output
	conn connection // nil until connect, and after disconnect or close
}

func (d *driver) run(ctx context.Context, cmd *command) (result, error) {
	switch cmd.Op {
	case "connect":
		return d.connect(ctx, cmd)
	case "subscribe":
		return d.subscribe(ctx, cmd)
	case "unsubscribe":
		return d.withConnection(func(c connection) error { return c.unsubscribe(ctx, cmd.Filter) })
	case "publish":
		if err := cmd.checkQoS(); err != nil {
			return nil, err
		}
		return d.withConnection(func(c connection) error { return c.publish(ctx, cmd) })
	case "disconnect":
		return d.end(func(c connection) error { return c.disconnect(ctx) })
	case "close":
		return d.end(func(c connection) error { return c.drop(ctx) })
	case "":
		return nil, errors.New("field 'op' is missing")
	}
	return nil, fmt.Errorf("unknown op %q", cmd.Op)
}

func (d *driver) connect(ctx context.Context, cmd *command) (result, error) {
	if cmd.ClientID == nil {
		return nil, errors.New("field 'client_id' is missing")
	}
	// A connection still held (one that was lost without reconnect) is replaced.
	if d.conn != nil {
		if err := d.conn.drop(ctx); err != nil {
			log.Printf("dropping the previous connection: %v", err)
		}
		d.conn = nil
	}
	var (
		conn           connection
		sessionPresent bool
		err            error
	)
	switch cmd.Version {
	case 4:
		conn, sessionPresent, err = connectV4(ctx, cmd, d.out)
	case 5:
		conn, sessionPresent, err = connectV5(ctx, cmd, d.out)
	default:
		return nil, fmt.Errorf("field 'version' must be 4 or 5, got %d", cmd.Version)
	}
	if err != nil {
		return nil, err
	}
	d.conn = conn
	return result{"session_present": sessionPresent}, nil
}

func (d *driver) subscribe(ctx context.Context, cmd *command) (result, error) {
	if err := cmd.checkQoS(); err != nil {
		return nil, err
	}
	if d.conn == nil {
		return nil, errors.New("not connected")
	}
	granted, err := d.conn.subscribe(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return result{"granted": granted}, nil
}

func (d *driver) withConnection(op func(connection) error) (result, error) {
	if d.conn == nil {
		return nil, errors.New("not connected")
	}
	return result{}, op(d.conn)
}

// end runs disconnect or close; the connection is forgotten either way.
func (d *driver) end(op func(connection) error) (result, error) {
	if d.conn == nil {
		return nil, errors.New("not connected")
	}
	conn := d.conn
	d.conn = nil
	return result{}, op(conn)
}

// answer runs one command within its timeout and writes its result line.
func (d *driver) answer(cmd *command) {
	ctx, cancel := context.WithTimeout(context.Background(), cmd.timeout())
	defer cancel()
	res, err := d.run(ctx, cmd)
	if err != nil {
		// The libraries report a deadline in words of their own; the protocol has one word.
		if ctx.Err() != nil {
			err = errors.New("timeout")
		}
		d.out.send(map[string]any{"id": cmd.ID, "ok": false, "error": err.Error()})
		return
	}
	res["id"] = cmd.ID
	res["ok"] = true
	d.out.send(res)
}

// parse decodes one line; a field of the wrong type is named in the error.
func parse(line []byte) (*command, error) {
	var cmd command
	err := json.Unmarshal(line, &cmd)
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typeErr):
		return &cmd, fmt.Errorf("field '%s' cannot be %s, it must be a %s", typeErr.Field, typeErr.Value, typeErr.Type)
	case err != nil:
		return &cmd, fmt.Errorf("bad command: %v", err)
	case cmd.ID == nil:
		return &cmd, errors.New("field 'id' is missing")
	}
	return &cmd, nil
}

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	d := &driver{out: &output{w: os.Stdout}}
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for lines.Scan() {
		if len(bytes.TrimSpace(lines.Bytes())) == 0 {
			continue
		}
		cmd, err := parse(lines.Bytes())
		if err != nil {
			d.out.send(map[string]any{"id": cmd.ID, "ok": false, "error": err.Error()})
			continue
		}
		if cmd.Op == "exit" {
			d.out.send(map[string]any{"id": cmd.ID, "ok": true})
			os.Exit(0)
		}
		d.answer(cmd)
	}
	if err := lines.Err(); err != nil {
		log.Fatalf("reading stdin: %v", err)
	}
}
