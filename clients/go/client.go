// Package herald is the Go client SDK for Herald, a real-time messaging server
// (docs/protocol.md in the Herald repository is the wire contract).
//
// A Client keeps one WebSocket connection to a node: it connects with a token (and asks a
// TokenFunc for a fresh one before it expires, sending refresh), keeps subscriptions across
// reconnects and recovers missed publications with since/epoch/offset, follows server-side
// subscriptions, reconnects with exponential backoff and full jitter (honouring the server's
// after_ms), stops for good on the permanent close codes 4500–4999, and notices a dead
// connection when the server's pings stop. Events reach the application through the callbacks
// in Handlers and SubscribeOptions, on one goroutine, in order.
//
// A Client is safe for concurrent use and keeps no global state.
package herald

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// State of a Client.
type State int

// The client's states: Disconnected (before Connect, after Disconnect/Close or a permanent close),
// Connecting (dialing, waiting for the connect reply, or waiting out the backoff), Connected.
const (
	StateDisconnected State = iota
	StateConnecting
	StateConnected
)

func (s State) String() string {
	switch s {
	case StateConnecting:
		return "connecting"
	case StateConnected:
		return "connected"
	}
	return "disconnected"
}

// Options configure a Client. Every field is optional.
type Options struct {
	// Token is the connection token (JWT). Leave it empty for anonymous connections (or when
	// TokenFunc provides tokens).
	Token string
	// TokenFunc is called for a token on the first connect (when Token is empty), before the
	// token expires (the client then sends refresh on the open connection), and after the server
	// closed with 4004 or refused an expired token (109). Returning "" with a nil error means the
	// user may not connect: the client stops (CodeNoToken). An error is reported and retried
	// with backoff. ctx ends when the client is closed or the attempt is abandoned.
	TokenFunc func(ctx context.Context) (string, error)
	// Name and Version are sent in connect (shown in server logs).
	Name    string
	Version string
	// Data is sent as connect.data on every connect (for the connect proxy); any JSON value.
	Data any
	// Header is added to the WebSocket upgrade request (e.g. cookies for the connect proxy).
	Header http.Header
	// HTTPClient is used for the upgrade; nil: http.DefaultClient.
	HTTPClient *http.Client
	// Subprotocols to request, e.g. "herald.v1.json".
	Subprotocols []string
	// MinReconnectDelay and MaxReconnectDelay bound the reconnect backoff window (defaults
	// 500 ms and 20 s). The delay of attempt n is uniform in [0, min(Max, Min·2^n)).
	MinReconnectDelay time.Duration
	MaxReconnectDelay time.Duration
	// Timeout bounds the dial, the connect command and every command (default 10 s).
	Timeout time.Duration
	// PingGrace is how long past the server's ping_interval a silent connection is still
	// trusted before it counts as dead and the client reconnects (default 10 s).
	PingGrace time.Duration
	// MaxMessageBytes limits one incoming WebSocket message (default 64 MiB).
	MaxMessageBytes int64
	// Compression offers permessage-deflate without context takeover (used where the node's
	// limits.compression is on; otherwise the connection is uncompressed).
	Compression bool

	Handlers
}

type pending struct {
	cb     func(json.RawMessage, error)
	timer  *time.Timer
	method string
}

type wsConn struct {
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	out    chan []byte
}

// Client is a connection to a Herald node. Create it with New, then call Connect.
type Client struct {
	url       string
	opts      Options
	timeout   time.Duration
	pingGrace time.Duration
	backoff   *Backoff
	disp      *dispatcher
	ctx       context.Context // ends with Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup // network and token goroutines

	mu              sync.Mutex
	state           State
	stateCh         chan struct{} // closed and replaced on every state change
	closed          bool
	conn            *wsConn
	attemptSeq      uint64
	attemptCancel   context.CancelFunc
	subs            map[string]*Subscription
	serverSubs      map[string]bool
	serverPositions map[string]*StreamPosition
	serverNoHistory map[string]bool // server-side channels without history: resubscribed without since
	pending         map[uint64]*pending
	nextID          uint64
	token           string
	needToken       bool
	disconnectPush  *serverMsg
	clientID        string
	pingInterval    time.Duration
	lastSeen        time.Time
	pingTimer       *time.Timer
	connectTimer    *time.Timer
	reconnectTimer  *time.Timer
	refreshTimer    *time.Timer
}

// New creates a client for a WebSocket URL such as "ws://127.0.0.1:8000/ws". It does not connect.
func New(url string, opts Options) (*Client, error) {
	if url == "" {
		return nil, &UsageError{Code: ErrBadRequest, Message: "empty URL"}
	}
	if opts.Timeout < 0 || opts.PingGrace < 0 || opts.MinReconnectDelay < 0 || opts.MaxReconnectDelay < 0 {
		return nil, &UsageError{Code: ErrBadRequest, Message: "durations in Options must not be negative"}
	}
	c := &Client{
		url:             url,
		opts:            opts,
		timeout:         opts.Timeout,
		pingGrace:       opts.PingGrace,
		backoff:         NewBackoff(opts.MinReconnectDelay, opts.MaxReconnectDelay),
		disp:            newDispatcher(),
		stateCh:         make(chan struct{}),
		subs:            map[string]*Subscription{},
		serverSubs:      map[string]bool{},
		serverPositions: map[string]*StreamPosition{},
		serverNoHistory: map[string]bool{},
		pending:         map[uint64]*pending{},
		token:           opts.Token,
		needToken:       opts.Token == "",
	}
	if c.timeout == 0 {
		c.timeout = 10 * time.Second
	}
	if c.pingGrace == 0 {
		c.pingGrace = 10 * time.Second
	}
	if c.opts.MaxMessageBytes <= 0 {
		c.opts.MaxMessageBytes = 64 << 20
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// State is the client's state now.
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// ClientID is the server's id for the current connection ("" while not connected).
func (c *Client) ClientID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clientID
}

// Connect starts connecting and returns at once; the client keeps reconnecting on its own until
// Disconnect, Close or a permanent close. Calling it while connecting or connected does nothing.
// It fails only after Close.
func (c *Client) Connect() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return &ConnectionError{Code: CodeClosed, Message: "client is closed"}
	}
	if c.state != StateDisconnected {
		return nil
	}
	c.backoff.Reset()
	c.setState(StateConnecting)
	c.emitConnecting(CodeConnectCalled, "connect called")
	c.startAttempt()
	return nil
}

// Disconnect closes the connection and stops reconnecting. Subscriptions stay registered: a
// later Connect restores and recovers them.
func (c *Client) Disconnect() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != StateDisconnected {
		c.stop(CodeDisconnectCalled, "disconnect called")
	}
}

// Close disconnects for good and waits (bounded by a few seconds) until the client's network
// goroutines have ended. Events already queued are still delivered; Done is closed after the last.
// The client cannot be used after Close. It may be called from a handler.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	if c.state != StateDisconnected {
		c.stop(CodeDisconnectCalled, "client closed")
	}
	c.closed = true
	for _, s := range c.subs {
		s.cancelRetry()
		c.stopTimer(&s.refreshTimer)
	}
	c.cancel()
	c.mu.Unlock()
	c.disp.close()
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(c.timeout + 5*time.Second):
		return errors.New("herald: Close: the client's goroutines did not end in time (a TokenFunc that ignores its context?)")
	}
}

// Done is closed when the client is closed and every event has been delivered to the handlers.
func (c *Client) Done() <-chan struct{} { return c.disp.done }

// WaitConnected blocks until the client is connected. It fails when ctx ends, or when the client
// is (or becomes) disconnected.
func (c *Client) WaitConnected(ctx context.Context) error {
	for {
		c.mu.Lock()
		st, ch := c.state, c.stateCh
		c.mu.Unlock()
		switch st {
		case StateConnected:
			return nil
		case StateDisconnected:
			return &ConnectionError{Code: CodeNotConnected, Message: "client is disconnected"}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Publish publishes data (any JSON value; a json.RawMessage is sent as it is) to a channel
// where the namespace lets clients publish. Like every command it waits while the client is
// connecting (up to Options.Timeout) and fails at once while it is disconnected.
func (c *Client) Publish(ctx context.Context, channel string, data any) (PublishResult, error) {
	var r PublishResult
	err := c.callInto(ctx, "publish", map[string]any{"channel": channel, "data": data}, &r)
	return r, err
}

// History reads a channel's history.
func (c *Client) History(ctx context.Context, channel string, opts HistoryOptions) (HistoryResult, error) {
	p := map[string]any{"channel": channel}
	if opts.Since != nil {
		p["since"] = opts.Since
	}
	if opts.Limit > 0 {
		p["limit"] = opts.Limit
	}
	var r HistoryResult
	err := c.callInto(ctx, "history", p, &r)
	return r, err
}

// Presence answers who is subscribed to a channel now.
func (c *Client) Presence(ctx context.Context, channel string) (PresenceResult, error) {
	var r PresenceResult
	err := c.callInto(ctx, "presence", map[string]any{"channel": channel}, &r)
	return r, err
}

// RPC calls the application's backend through the server's rpc proxy and returns its answer's
// data (nil when it returned none). A *ReplyError carries 108 (no rpc proxy configured), 112
// (backend unreachable; temporary) or the backend's own code (1000–1999).
func (c *Client) RPC(ctx context.Context, method string, data any) (json.RawMessage, error) {
	p := map[string]any{"method": method}
	if data != nil {
		p["data"] = data
	}
	var r struct {
		Data json.RawMessage `json:"data"`
	}
	err := c.callInto(ctx, "rpc", p, &r)
	return r.Data, err
}

// Call sends any command and returns its raw result.
func (c *Client) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	return c.call(ctx, method, params)
}

func (c *Client) callInto(ctx context.Context, method string, params any, out any) error {
	raw, err := c.call(ctx, method, params)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return &ConnectionError{Code: CodeBadFrame, Message: fmt.Sprintf("bad %s result: %v", method, err)}
	}
	return nil
}

type callResult struct {
	raw json.RawMessage
	err error
}

func (c *Client) call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	waitConn := time.NewTimer(c.timeout)
	defer waitConn.Stop()
	for {
		c.mu.Lock()
		switch c.state {
		case StateConnected:
			ch := make(chan callResult, 1)
			c.request(method, params, func(raw json.RawMessage, err error) { ch <- callResult{raw, err} })
			c.mu.Unlock()
			select {
			case r := <-ch:
				return r.raw, r.err
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case StateConnecting:
			ch := c.stateCh
			c.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-waitConn.C:
				return nil, &TimeoutError{Method: method + " (waiting for a connection)"}
			}
		default:
			closed := c.closed
			c.mu.Unlock()
			if closed {
				return nil, &ConnectionError{Code: CodeClosed, Message: "client is closed"}
			}
			return nil, &ConnectionError{Code: CodeNotConnected, Message: "client is disconnected; call Connect first"}
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Connection attempts. Methods below run with c.mu held unless they say otherwise.

func (c *Client) startAttempt() {
	c.stopTimer(&c.reconnectTimer)
	if c.attemptCancel != nil {
		c.attemptCancel()
	}
	c.attemptSeq++
	seq := c.attemptSeq
	needTok := c.opts.TokenFunc != nil && (c.needToken || c.token == "")
	ctx, cancel := context.WithCancel(c.ctx)
	c.attemptCancel = cancel
	c.wg.Add(1)
	go c.dial(ctx, cancel, seq, needTok)
}

// dial runs on its own goroutine, without the lock.
func (c *Client) dial(ctx context.Context, cancel context.CancelFunc, seq uint64, needTok bool) {
	defer c.wg.Done()
	defer cancel()
	current := func() bool { return seq == c.attemptSeq && c.state == StateConnecting }
	if needTok {
		tctx, tcancel := context.WithTimeout(ctx, c.timeout)
		tok, err := c.opts.TokenFunc(tctx)
		tcancel()
		c.mu.Lock()
		if !current() {
			c.mu.Unlock()
			return
		}
		switch {
		case err != nil:
			c.reportError("token", &ConnectionError{Code: CodeNoToken, Message: "token func failed: " + err.Error()}, "")
			c.scheduleReconnect(-1)
		case tok == "":
			c.stop(CodeNoToken, "token func returned no token")
		default:
			c.token, c.needToken = tok, false
		}
		c.mu.Unlock()
		if err != nil || tok == "" {
			return
		}
	}
	dctx, dcancel := context.WithTimeout(ctx, c.timeout)
	dopts := &websocket.DialOptions{
		HTTPClient:   c.opts.HTTPClient,
		HTTPHeader:   c.opts.Header,
		Subprotocols: c.opts.Subprotocols,
	}
	if c.opts.Compression {
		dopts.CompressionMode = websocket.CompressionNoContextTakeover
	}
	ws, _, err := websocket.Dial(dctx, c.url, dopts)
	dcancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !current() {
		if ws != nil {
			ws.CloseNow()
		}
		return
	}
	if err != nil {
		code := CodeTransportClosed
		if errors.Is(err, context.DeadlineExceeded) {
			code = CodeConnectTimeout
		}
		c.connectionLost(code, "dial failed: "+err.Error())
		return
	}
	ws.SetReadLimit(c.opts.MaxMessageBytes)
	cctx, ccancel := context.WithCancel(c.ctx)
	conn := &wsConn{ws: ws, ctx: cctx, cancel: ccancel, out: make(chan []byte, 4096)}
	c.conn = conn
	c.disconnectPush = nil
	c.wg.Add(2)
	go c.readLoop(conn)
	go c.writeLoop(conn)
	c.sendConnect()
	c.setTimer(&c.connectTimer, c.timeout, func() { c.abort(CodeConnectTimeout, "connect timed out") })
}

func (c *Client) readLoop(conn *wsConn) {
	defer c.wg.Done()
	defer conn.ws.CloseNow()
	for {
		typ, data, err := conn.ws.Read(conn.ctx)
		if err != nil {
			code := int(websocket.CloseStatus(err))
			reason := err.Error()
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				reason = ce.Reason
			}
			if code < 0 {
				code = CodeTransportClosed
			}
			c.mu.Lock()
			if c.conn == conn {
				c.conn = nil
				conn.cancel()
				c.connectionLost(code, reason)
			}
			c.mu.Unlock()
			return
		}
		c.mu.Lock()
		if c.conn != conn {
			c.mu.Unlock()
			return
		}
		c.lastSeen = time.Now()
		if typ != websocket.MessageText {
			c.reportError("protocol", &ConnectionError{Code: CodeBadFrame, Message: "binary frame from server"}, "")
		} else {
			for _, m := range decodeFrame(data) {
				// A message may have ended this connection; the rest belongs to a gone one.
				if c.conn != conn {
					break
				}
				c.onMessage(m)
			}
		}
		c.mu.Unlock()
	}
}

func (c *Client) writeLoop(conn *wsConn) {
	defer c.wg.Done()
	for {
		select {
		case <-conn.ctx.Done():
			return
		case b := <-conn.out:
			wctx, cancel := context.WithTimeout(conn.ctx, c.timeout)
			err := conn.ws.Write(wctx, websocket.MessageText, b)
			cancel()
			if err != nil {
				conn.ws.CloseNow() // the reader sees the error and reports the loss
				return
			}
		}
	}
}

// send queues one message on the current connection.
func (c *Client) send(b []byte) bool {
	conn := c.conn
	if conn == nil {
		return false
	}
	select {
	case conn.out <- b:
		return true
	default:
		c.abort(CodeTransportClosed, "outbound queue full")
		return false
	}
}

// request sends a command; cb runs (with the lock held) with its result or error, exactly once.
func (c *Client) request(method string, params any, cb func(json.RawMessage, error)) {
	c.nextID++
	id := c.nextID
	b, err := encodeCommand(id, method, params)
	if err != nil {
		cb(nil, &UsageError{Code: ErrBadRequest, Message: err.Error()})
		return
	}
	if !c.send(b) {
		cb(nil, &ConnectionError{Code: CodeConnectionLost, Message: "not connected"})
		return
	}
	p := &pending{cb: cb, method: method}
	p.timer = time.AfterFunc(c.timeout, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.pending[id] == p {
			delete(c.pending, id)
			p.cb(nil, &TimeoutError{Method: method})
		}
	})
	c.pending[id] = p
}

func (c *Client) sendConnect() {
	subs := map[string]any{}
	var included []*Subscription
	for _, s := range c.subs {
		if s.sentAlone() {
			continue // subscriptions with a token or data are sent one by one
		}
		since := s.subscribeSent()
		if since != nil {
			subs[s.channel] = map[string]any{"since": since}
		} else {
			subs[s.channel] = map[string]any{}
		}
		included = append(included, s)
	}
	// Server-side subscriptions of the last connection, named with since so the server recovers.
	for ch, pos := range c.serverPositions {
		if _, ok := subs[ch]; !ok {
			if c.serverNoHistory[ch] {
				subs[ch] = map[string]any{}
			} else {
				subs[ch] = map[string]any{"since": *pos}
			}
		}
	}
	params := map[string]any{}
	if c.token != "" {
		params["token"] = c.token
	}
	if c.opts.Name != "" {
		params["name"] = c.opts.Name
	}
	if c.opts.Version != "" {
		params["version"] = c.opts.Version
	}
	if c.opts.Data != nil {
		params["data"] = c.opts.Data
	}
	if len(subs) > 0 {
		params["subs"] = subs
	}
	c.request("connect", params, func(raw json.RawMessage, err error) { c.onConnectReply(raw, err, included) })
}

func (c *Client) onConnectReply(raw json.RawMessage, err error, included []*Subscription) {
	c.stopTimer(&c.connectTimer)
	for _, s := range included {
		s.busy = false
	}
	var r connectResult
	if err == nil {
		if jerr := json.Unmarshal(raw, &r); jerr != nil {
			err = &ConnectionError{Code: CodeBadFrame, Message: "bad connect reply: " + jerr.Error()}
		}
	}
	if err != nil {
		var re *ReplyError
		var te *TimeoutError
		var ce *ConnectionError
		switch {
		case errors.As(err, &re):
			c.reportError("connect", err, "")
			if re.Code == ErrTokenExpired && c.opts.TokenFunc != nil {
				c.needToken = true
				c.abort(re.Code, re.Message)
			} else if IsTemporary(re.Code) {
				c.abort(re.Code, re.Message)
			} else {
				c.stop(re.Code, re.Message)
			}
		case errors.As(err, &te):
			c.abort(CodeConnectTimeout, "connect timed out")
		case errors.As(err, &ce) && ce.Code == CodeBadFrame:
			c.reportError("protocol", err, "")
			c.abort(CodeBadFrame, ce.Message)
		}
		// Other ConnectionErrors: the socket already closed; connectionLost handled it.
		return
	}

	c.backoff.Reset()
	c.clientID = r.Client
	c.pingInterval = time.Duration(r.PingInterval * float64(time.Second))
	c.lastSeen = time.Now()
	c.armPingWatch()
	ev := ConnectedEvent{Client: r.Client, Node: r.Node, PingInterval: c.pingInterval, Data: r.Data}
	if r.ExpiresIn != nil && *r.ExpiresIn > 0 {
		ev.ExpiresIn = time.Duration(*r.ExpiresIn * float64(time.Second))
		c.scheduleRefresh(ev.ExpiresIn)
	}
	c.setState(StateConnected)
	c.emit(func(h *Handlers) {
		if h.OnConnected != nil {
			h.OnConnected(ev)
		}
	})

	requested := map[string]bool{}
	for _, s := range included {
		requested[s.channel] = true
	}
	for ch := range c.serverPositions {
		if res, ok := r.Subs[ch]; !ok || res == nil || res.Error != nil {
			delete(c.serverPositions, ch) // no longer granted
			delete(c.serverNoHistory, ch)
		}
	}
	for ch, res := range r.Subs {
		if requested[ch] || res == nil || res.Error != nil {
			continue
		}
		c.serverSubs[ch] = true
		held := c.serverPositions[ch]
		if c.serverNoHistory[ch] {
			held = nil // named without since: nothing to recover
		}
		recovered := res.Recovered != nil && *res.Recovered
		ev := ServerSubscribedEvent{
			Channel: ch, Epoch: res.Epoch, Offset: res.Offset, Recoverable: res.recoverable(),
			Recovering: held != nil, Recovered: recovered && held != nil && held.Epoch == res.Epoch,
		}
		c.serverNoHistory[ch] = !res.recoverable()
		if !ev.Recovered {
			c.serverPositions[ch] = &StreamPosition{Epoch: res.Epoch, Offset: res.Offset}
		}
		c.emit(func(h *Handlers) {
			if h.OnServerSubscribed != nil {
				h.OnServerSubscribed(ev)
			}
		})
		if ev.Recovered {
			for i := range res.Publications {
				c.serverPublication(ch, &res.Publications[i])
			}
			if pos := c.serverPositions[ch]; pos != nil && pos.Offset < res.Offset {
				pos.Offset = res.Offset
			}
		}
	}
	for _, s := range included {
		if c.subs[s.channel] != s || c.state != StateConnected {
			continue
		}
		res, ok := r.Subs[s.channel]
		switch {
		case !ok || res == nil:
			c.sendSubscribe(s) // not answered in connect: ask on its own
		case res.Error != nil:
			c.onSubscribeError(s, &ReplyError{Code: res.Error.Code, Message: res.Error.Message})
		default:
			c.applySubscribe(s, res)
		}
	}
	// Subscriptions created while connect was in flight, or sent alone.
	for _, s := range c.subs {
		if c.state != StateConnected {
			break
		}
		if s.needsSubscribe() {
			c.sendSubscribe(s)
		}
	}
}

func (c *Client) scheduleReconnect(afterMs int64) {
	var floor time.Duration
	if afterMs > 0 {
		floor = time.Duration(afterMs) * time.Millisecond
	}
	d := c.backoff.Next(floor)
	c.setTimer(&c.reconnectTimer, d, func() {
		if c.state == StateConnecting {
			c.startAttempt()
		}
	})
}

// abort gives up on the current connection (no ping, timeout, retryable connect error).
func (c *Client) abort(code int, reason string) {
	conn := c.conn
	if conn == nil {
		return
	}
	c.conn = nil
	conn.cancel()
	c.connectionLost(code, reason)
}

// connectionLost: the connection is gone (c.conn already cleared); reconnect or stop.
func (c *Client) connectionLost(code int, reason string) {
	push := c.disconnectPush
	c.disconnectPush = nil
	// The push and the close frame carry the same code; a proxy may have eaten the close code.
	if !(code >= 4000 && code <= 4999) && push != nil {
		code = push.code
	}
	if push != nil && push.reason != "" {
		reason = push.reason
	}
	c.teardown(code, reason)
	if c.state == StateDisconnected {
		return
	}
	if code == CloseTokenExpired {
		c.needToken = true
	}
	reconnect := (push == nil || push.reconnect) && ShouldReconnect(code)
	if !reconnect {
		c.stop(code, reason)
		return
	}
	if c.state != StateConnecting {
		c.setState(StateConnecting)
		c.emitConnecting(code, reason)
	}
	after := int64(-1)
	if push != nil {
		after = push.afterMs
	}
	c.scheduleReconnect(after)
}

// stop is the final stop: close everything and emit OnDisconnected.
func (c *Client) stop(code int, reason string) {
	c.attemptSeq++
	if c.attemptCancel != nil {
		c.attemptCancel()
		c.attemptCancel = nil
	}
	if conn := c.conn; conn != nil {
		c.conn = nil
		c.wg.Add(1)
		go func() {
			// A polite close (1000), bounded: the reader ends when it completes.
			defer c.wg.Done()
			t := time.AfterFunc(time.Second, func() { conn.ws.CloseNow() })
			conn.ws.Close(websocket.StatusNormalClosure, "client disconnect")
			t.Stop()
			conn.cancel()
		}()
	}
	c.teardown(code, reason)
	c.stopTimer(&c.reconnectTimer)
	for _, s := range c.subs {
		s.notify()
	}
	if c.state == StateDisconnected {
		return
	}
	c.setState(StateDisconnected)
	ev := DisconnectedEvent{Code: code, Reason: reason}
	c.emit(func(h *Handlers) {
		if h.OnDisconnected != nil {
			h.OnDisconnected(ev)
		}
	})
}

// teardown forgets the dead connection: timers, in-flight commands, server-side subscriptions.
func (c *Client) teardown(code int, reason string) {
	c.stopTimer(&c.connectTimer)
	c.stopTimer(&c.pingTimer)
	c.stopTimer(&c.refreshTimer)
	c.clientID = ""
	clear(c.serverSubs)
	pend := c.pending
	c.pending = map[uint64]*pending{}
	for _, s := range c.subs {
		s.connectionLost()
	}
	for _, p := range pend {
		p.timer.Stop()
		p.cb(nil, &ConnectionError{Code: CodeConnectionLost, Message: "connection lost: " + reason, CloseCode: code})
	}
}

// ---------------------------------------------------------------------------------------------
// Incoming messages

func (c *Client) onMessage(m serverMsg) {
	switch m.kind {
	case msgReply:
		p := c.pending[m.id]
		if p == nil {
			return // a late reply to a command that timed out
		}
		delete(c.pending, m.id)
		p.timer.Stop()
		if m.err != nil {
			p.cb(nil, &ReplyError{Code: m.err.Code, Message: m.err.Message})
		} else {
			p.cb(m.result, nil)
		}
	case msgPing:
		c.send([]byte("{}"))
	case msgPub:
		s := c.subs[m.channel]
		if s == nil {
			if c.serverSubs[m.channel] {
				c.serverPublication(m.channel, &m.pub)
			}
			return
		}
		if s.applyPublication(&m.pub, m.delta) {
			c.resync(s, true)
		}
	case msgSkip:
		if s := c.subs[m.channel]; s != nil {
			if s.applySkip(m.from, m.to) {
				c.resync(s, true)
			}
		} else if c.serverSubs[m.channel] {
			c.serverSkip(m.channel, m.from, m.to)
		}
	case msgJoin, msgLeave:
		ev := PresenceEvent{Channel: m.channel, Info: m.info}
		join := m.kind == msgJoin
		if s := c.subs[m.channel]; s != nil {
			s.applyPresence(join, ev)
		} else if c.serverSubs[m.channel] {
			c.emit(func(h *Handlers) {
				if join && h.OnJoin != nil {
					h.OnJoin(ev)
				} else if !join && h.OnLeave != nil {
					h.OnLeave(ev)
				}
			})
		}
	case msgSubscribed:
		if c.subs[m.channel] != nil {
			return
		}
		c.serverSubs[m.channel] = true
		r := m.sub
		c.serverPositions[m.channel] = &StreamPosition{Epoch: r.Epoch, Offset: r.Offset}
		c.serverNoHistory[m.channel] = !r.recoverable()
		ev := ServerSubscribedEvent{Channel: m.channel, Epoch: r.Epoch, Offset: r.Offset, Recoverable: r.recoverable()}
		c.emit(func(h *Handlers) {
			if h.OnServerSubscribed != nil {
				h.OnServerSubscribed(ev)
			}
		})
	case msgUnsub:
		s := c.subs[m.channel]
		if s == nil {
			delete(c.serverPositions, m.channel)
			delete(c.serverNoHistory, m.channel)
			if c.serverSubs[m.channel] {
				delete(c.serverSubs, m.channel)
				ev := UnsubscribedEvent{Channel: m.channel, Code: m.code, Reason: m.reason}
				c.emit(func(h *Handlers) {
					if h.OnUnsubscribed != nil {
						h.OnUnsubscribed(ev)
					}
				})
			}
			return
		}
		if shouldResubscribe(m.code) {
			if m.code == UnsubTokenExpired && s.opts.TokenFunc != nil {
				s.needToken = true // the resubscribe needs a fresh token
			}
			c.resync(s, false)
		} else {
			delete(c.subs, s.channel)
			s.end(m.code, m.reason, nil)
		}
	case msgDisconnect:
		mm := m
		c.disconnectPush = &mm // the close frame that follows ends the connection
	case msgInvalid:
		c.reportError("protocol", &ConnectionError{Code: CodeBadFrame, Message: "bad message from server: " + m.bad}, "")
	}
}

// serverPublication delivers a publication of a server-side subscription once, in order.
func (c *Client) serverPublication(channel string, p *Publication) {
	pos := c.serverPositions[channel]
	epoch := ""
	if pos != nil && !c.serverNoHistory[channel] {
		epoch = pos.Epoch
		if p.Offset > 0 {
			if p.Offset <= pos.Offset {
				return // already delivered
			}
			pos.Offset = p.Offset
		}
	}
	ev := PublicationEvent{Channel: channel, Offset: p.Offset, Epoch: epoch, Data: p.Data, Info: p.Info, Tags: p.Tags}
	c.emit(func(h *Handlers) {
		if h.OnPublication != nil {
			h.OnPublication(ev)
		}
	})
}

// serverSkip handles a skip push of a server-side subscription: its position moves to to (the
// next connect recovers from there) and OnSkipped says so; a stale skip is ignored. As for its
// publications (serverPublication), a hole before the skip is not recovered live: the client
// cannot resubscribe a server-side subscription on its own.
func (c *Client) serverSkip(channel string, from, to uint64) {
	if pos := c.serverPositions[channel]; pos != nil && !c.serverNoHistory[channel] {
		if to <= pos.Offset {
			return // stale: already past it
		}
		pos.Offset = to
	}
	ev := SkippedEvent{Channel: channel, From: from, To: to}
	c.emit(func(h *Handlers) {
		if h.OnSkipped != nil {
			h.OnSkipped(ev)
		}
	})
}

// ---------------------------------------------------------------------------------------------
// Pings and token refresh

// armPingWatch: the server pings every ping_interval and anything received counts as life; past
// ping_interval + grace of silence the connection counts as dead.
func (c *Client) armPingWatch() {
	c.stopTimer(&c.pingTimer)
	if c.pingInterval <= 0 {
		return
	}
	limit := c.pingInterval + c.pingGrace
	wait := max(time.Until(c.lastSeen.Add(limit)), 0)
	c.setTimer(&c.pingTimer, wait, func() {
		if c.conn == nil {
			return
		}
		if time.Since(c.lastSeen) >= limit {
			c.abort(CodeNoPing, "no ping from server")
		} else {
			c.armPingWatch()
		}
	})
}

func (c *Client) scheduleRefresh(expiresIn time.Duration) {
	c.stopTimer(&c.refreshTimer)
	if c.opts.TokenFunc == nil {
		return // a fixed token cannot be refreshed; the server will close with 4004
	}
	// 10 s early, or a quarter of the lifetime for short-lived tokens.
	delay := max(expiresIn-min(10*time.Second, expiresIn/4), 0)
	c.setTimer(&c.refreshTimer, delay, c.refreshToken)
}

func (c *Client) refreshToken() {
	conn := c.conn
	if conn == nil || c.closed {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		tctx, cancel := context.WithTimeout(c.ctx, c.timeout)
		tok, err := c.opts.TokenFunc(tctx)
		cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		if err != nil {
			c.reportError("refresh", &ConnectionError{Code: CodeNoToken, Message: "token func failed: " + err.Error()}, "")
			if c.conn == conn { // try again shortly; if it expires first, 4004 and a reconnect
				c.setTimer(&c.refreshTimer, 2*time.Second, c.refreshToken)
			}
			return
		}
		if c.conn != conn || c.state != StateConnected {
			if tok != "" { // still good for the next connect
				c.token, c.needToken = tok, false
			}
			return
		}
		if tok == "" {
			c.stop(CodeNoToken, "token func returned no token")
			return
		}
		c.token = tok
		c.request("refresh", map[string]any{"token": tok}, func(raw json.RawMessage, err error) {
			if err != nil {
				var ce *ConnectionError
				if !errors.As(err, &ce) {
					c.reportError("refresh", err, "")
				}
				c.needToken = true // the reconnect after 4004 fetches a fresh one
				return
			}
			var r struct {
				ExpiresIn *float64 `json:"expires_in"`
			}
			if json.Unmarshal(raw, &r) == nil && r.ExpiresIn != nil && *r.ExpiresIn > 0 && c.conn == conn {
				c.scheduleRefresh(time.Duration(*r.ExpiresIn * float64(time.Second)))
			}
		})
	}()
}

// ---------------------------------------------------------------------------------------------
// Small helpers (lock held)

func (c *Client) setState(s State) {
	if c.state == s {
		return
	}
	c.state = s
	close(c.stateCh)
	c.stateCh = make(chan struct{})
}

// setTimer (re)arms a timer slot; f runs with the lock held, unless the slot was re-armed or
// stopped meanwhile.
func (c *Client) setTimer(slot **time.Timer, d time.Duration, f func()) {
	c.stopTimer(slot)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if *slot != t {
			return
		}
		*slot = nil
		f()
	})
	*slot = t
}

func (c *Client) stopTimer(slot **time.Timer) {
	if *slot != nil {
		(*slot).Stop()
		*slot = nil
	}
}

func (c *Client) emit(f func(h *Handlers)) {
	h := &c.opts.Handlers
	c.disp.push(func() { f(h) })
}

func (c *Client) emitConnecting(code int, reason string) {
	ev := ConnectingEvent{Code: code, Reason: reason}
	c.emit(func(h *Handlers) {
		if h.OnConnecting != nil {
			h.OnConnecting(ev)
		}
	})
}

func (c *Client) reportError(typ string, err error, channel string) {
	ev := ErrorEvent{Type: typ, Err: err, Channel: channel}
	c.emit(func(h *Handlers) {
		if h.OnError != nil {
			h.OnError(ev)
		}
	})
}
