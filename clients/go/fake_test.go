package herald

// Unit tests of the client's state machine against an in-process fake server (a test double
// speaking the wire protocol over a real WebSocket): permanent close, after_ms, dead-connection
// detection, pong, typed errors, timeouts, gap resync. The real node is in integration_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

type fakeConn struct {
	t   *testing.T
	ws  *websocket.Conn
	ctx context.Context
	n   int
}

type cmd struct {
	ID     uint64
	Method string
	Params map[string]json.RawMessage
}

func (f *fakeConn) read() (cmd, error) {
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	_, b, err := f.ws.Read(ctx)
	if err != nil {
		return cmd{}, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return cmd{}, err
	}
	var c cmd
	for k, v := range raw {
		if k == "id" {
			json.Unmarshal(v, &c.ID)
		} else {
			c.Method = k
			json.Unmarshal(v, &c.Params)
		}
	}
	return c, nil
}

func (f *fakeConn) send(lines ...string) {
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	f.ws.Write(ctx, websocket.MessageText, []byte(strings.Join(lines, "\n")))
}

// handshake reads connect and answers it with result (a JSON object's body).
func (f *fakeConn) handshake(result string) cmd {
	c, err := f.read()
	if err != nil {
		return c // the client went away (e.g. the test is ending)
	}
	if c.Method != "connect" {
		f.t.Errorf("fake server: expected connect, got %+v", c)
		return c
	}
	f.send(`{"id":` + itoa(c.ID) + `,"connect":` + result + `}`)
	return c
}

func itoa(v uint64) string { b, _ := json.Marshal(v); return string(b) }

// fakeServer runs handle for each WebSocket connection (n counts from 1). The handler's ctx ends
// with the test.
func fakeServer(t *testing.T, handle func(f *fakeConn)) (url string, conns *atomic.Int32) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conns = &atomic.Int32{}
	var handlers sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		n := int(conns.Add(1))
		handle(&fakeConn{t: t, ws: ws, ctx: ctx, n: n})
	}))
	// No handler outlives the test (hijacked WebSocket handlers are not waited for by srv.Close).
	t.Cleanup(func() { cancel(); srv.Close(); handlers.Wait() })
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws", conns
}

// recorder collects events as strings, for bounded waits.
type recorder struct {
	mu     sync.Mutex
	events []string
	times  []time.Time
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.times = append(r.times, time.Now())
	r.mu.Unlock()
}

func (r *recorder) wait(t *testing.T, prefix string, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		for i, e := range r.events {
			if strings.HasPrefix(e, prefix) {
				at := r.times[i]
				r.mu.Unlock()
				return at
			}
		}
		r.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no event %q within %v; events: %v", prefix, within, r.all())
	return time.Time{}
}

// waitN waits for the n-th event starting with prefix and returns when it happened.
func (r *recorder) waitN(t *testing.T, prefix string, n int, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		seen := 0
		for i, e := range r.events {
			if strings.HasPrefix(e, prefix) {
				if seen++; seen == n {
					at := r.times[i]
					r.mu.Unlock()
					return at
				}
			}
		}
		r.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("fewer than %d events %q within %v; events: %v", n, prefix, within, r.all())
	return time.Time{}
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *recorder) count(prefix string) int {
	n := 0
	for _, e := range r.all() {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

func recordingOptions(r *recorder) Options {
	return Options{
		MinReconnectDelay: 10 * time.Millisecond,
		MaxReconnectDelay: 50 * time.Millisecond,
		Timeout:           2 * time.Second,
		Handlers: Handlers{
			OnConnecting:   func(e ConnectingEvent) { r.add("connecting " + itoa(uint64(e.Code))) },
			OnConnected:    func(e ConnectedEvent) { r.add("connected " + e.Client) },
			OnDisconnected: func(e DisconnectedEvent) { r.add("disconnected " + itoa(uint64(e.Code))) },
			OnPublication:  func(e PublicationEvent) { r.add("serverpub " + e.Channel + " " + string(e.Data)) },
		},
	}
}

func newTestClient(t *testing.T, url string, opts Options) *Client {
	t.Helper()
	c, err := New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	return c
}

const okConnect = `{"client":"c1","node":"n","ping_interval":25}`

func TestPermanentCloseStopsForGood(t *testing.T) {
	for _, tc := range []struct {
		name string
		push string
		code int
	}{
		{"push and close 4502", `{"disconnect":{"code":4502,"reason":"disconnected by the API","reconnect":false}}`, 4502},
		{"close frame 4503 only", "", 4503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, conns := fakeServer(t, func(f *fakeConn) {
				f.handshake(okConnect)
				if tc.push != "" {
					f.send(tc.push)
				}
				f.ws.Close(websocket.StatusCode(tc.code), "bye")
			})
			r := &recorder{}
			newTestClient(t, url, recordingOptions(r))
			r.wait(t, "disconnected "+itoa(uint64(tc.code)), 3*time.Second)
			time.Sleep(300 * time.Millisecond) // 30 backoff windows: a retry would show
			if n := conns.Load(); n != 1 {
				t.Fatalf("%d connections after a permanent close, want 1", n)
			}
			if n := r.count("connecting ") - r.count("connecting 0"); n != 0 {
				t.Fatalf("a permanent close must not report a retrying disconnect: %v", r.all())
			}
		})
	}
}

func TestInvalidTokenStops(t *testing.T) {
	url, conns := fakeServer(t, func(f *fakeConn) {
		c, _ := f.read()
		f.send(`{"id":` + itoa(c.ID) + `,"error":{"code":101,"message":"invalid token"}}`)
		f.ws.Close(4501, "unauthorized")
	})
	r := &recorder{}
	opts := recordingOptions(r)
	opts.Token = "x.y.z"
	newTestClient(t, url, opts)
	r.wait(t, "disconnected 101", 3*time.Second)
	time.Sleep(200 * time.Millisecond)
	if n := conns.Load(); n != 1 || r.count("disconnected") != 1 {
		t.Fatalf("connections %d, events %v", n, r.all())
	}
}

func TestReconnectHonoursAfterMs(t *testing.T) {
	var closedAt atomic.Int64
	url, _ := fakeServer(t, func(f *fakeConn) {
		f.handshake(okConnect)
		if f.n == 1 {
			f.send(`{"disconnect":{"code":4000,"reason":"shutdown","reconnect":true,"after_ms":400}}`)
			closedAt.Store(time.Now().UnixNano())
			f.ws.Close(4000, "shutdown")
			return
		}
		<-f.ctx.Done()
	})
	r := &recorder{}
	newTestClient(t, url, recordingOptions(r))
	r.wait(t, "connecting 4000", 3*time.Second)
	second := r.waitN(t, "connected", 2, 3*time.Second)
	if d := second.Sub(time.Unix(0, closedAt.Load())); d < 390*time.Millisecond {
		t.Fatalf("reconnected %v after a disconnect with after_ms 400 (backoff window is only 10 ms)", d)
	}
}

func TestDeadConnectionDetected(t *testing.T) {
	url, conns := fakeServer(t, func(f *fakeConn) {
		f.handshake(`{"client":"c","node":"n","ping_interval":0.2}`)
		<-f.ctx.Done() // silence: no pings, no close
	})
	r := &recorder{}
	opts := recordingOptions(r)
	opts.PingGrace = 200 * time.Millisecond
	start := time.Now()
	newTestClient(t, url, opts)
	at := r.wait(t, "connecting 3", 3*time.Second) // CodeNoPing
	if d := at.Sub(start); d < 350*time.Millisecond {
		t.Fatalf("declared dead after %v, before ping_interval + grace (400 ms)", d)
	}
	deadline := time.Now().Add(3 * time.Second)
	for conns.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if conns.Load() < 2 {
		t.Fatal("no reconnect after the dead connection")
	}
}

func TestPingIsAnsweredAndKeepsAlive(t *testing.T) {
	gotPong := make(chan struct{}, 10)
	url, _ := fakeServer(t, func(f *fakeConn) {
		f.handshake(`{"client":"c","node":"n","ping_interval":0.2}`)
		for range 6 {
			f.send(`{}`)
			ctx, cancel := context.WithTimeout(f.ctx, time.Second)
			_, b, err := f.ws.Read(ctx)
			cancel()
			if err != nil {
				return
			}
			if string(b) == "{}" {
				gotPong <- struct{}{}
			}
			time.Sleep(150 * time.Millisecond)
		}
		<-f.ctx.Done()
	})
	r := &recorder{}
	opts := recordingOptions(r)
	opts.PingGrace = 200 * time.Millisecond
	newTestClient(t, url, opts)
	for i := range 6 {
		select {
		case <-gotPong:
		case <-time.After(2 * time.Second):
			t.Fatalf("pong %d not received", i)
		}
	}
	if n := r.count("connecting 3"); n != 0 {
		t.Fatalf("pinged connection declared dead: %v", r.all())
	}
}

func TestTypedErrorsAndTimeout(t *testing.T) {
	url, _ := fakeServer(t, func(f *fakeConn) {
		f.handshake(okConnect)
		for {
			c, err := f.read()
			if err != nil {
				return
			}
			switch c.Method {
			case "publish":
				f.send(`{"id":` + itoa(c.ID) + `,"error":{"code":103,"message":"permission denied"}}`)
			case "presence": // never answered
			case "rpc":
				f.send(`{"id":` + itoa(c.ID) + `,"rpc":{"data":{"echo":` + string(c.Params["data"]) + `}}}`)
			}
		}
	})
	r := &recorder{}
	opts := recordingOptions(r)
	opts.Timeout = 300 * time.Millisecond
	c := newTestClient(t, url, opts)
	ctx := context.Background()
	_, err := c.Publish(ctx, "ch", map[string]int{"n": 1})
	var re *ReplyError
	if !errors.As(err, &re) || re.Code != 103 || re.Temporary() || ErrorCode(err) != 103 {
		t.Fatalf("publish: want ReplyError 103, got %#v", err)
	}
	start := time.Now()
	_, err = c.Presence(ctx, "ch")
	var te *TimeoutError
	if !errors.As(err, &te) || time.Since(start) > 2*time.Second {
		t.Fatalf("presence: want TimeoutError after ~300 ms, got %v after %v", err, time.Since(start))
	}
	data, err := c.RPC(ctx, "m", map[string]int{"q": 1})
	if err != nil || string(data) != `{"echo":{"q":1}}` {
		t.Fatalf("rpc: %s %v", data, err)
	}
}

func TestNotConnectedAndUsageErrors(t *testing.T) {
	c, err := New("ws://127.0.0.1:1/ws", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Publish(context.Background(), "ch", 1)
	var ce *ConnectionError
	if !errors.As(err, &ce) || ce.Code != CodeNotConnected {
		t.Fatalf("want ConnectionError %d, got %v", CodeNotConnected, err)
	}
	if _, err := c.Subscribe("bad name", SubscribeOptions{}); ErrorCode(err) != ErrBadRequest {
		t.Fatalf("bad channel: %v", err)
	}
	if _, err := c.Subscribe("ok", SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subscribe("ok", SubscribeOptions{}); ErrorCode(err) != CodeAlreadySubscribed {
		t.Fatalf("twice: %v", err)
	}
	if _, err := New("", Options{}); err == nil {
		t.Fatal("empty URL must fail")
	}
	c.Close()
	if err := c.Connect(); ErrorCode(err) != CodeClosed {
		t.Fatalf("Connect after Close: %v", err)
	}
}

// A hole in live offsets makes the client unsubscribe and subscribe again with since; the
// recovered publications fill it, in order, once each. The connect reply and a publication
// arrive batched in one frame.
func TestGapTriggersResync(t *testing.T) {
	var resubscribeSince atomic.Value
	url, _ := fakeServer(t, func(f *fakeConn) {
		c, _ := f.read()
		f.send(`{"id":`+itoa(c.ID)+`,"connect":{"client":"c","node":"n","ping_interval":25,"subs":{"room":{"epoch":"E","offset":0,"recoverable":true}}}}`,
			`{"pub":{"channel":"room","offset":1,"data":"a"}}`)
		f.send(`{"pub":{"channel":"room","offset":3,"data":"c"}}`)
		for {
			c, err := f.read()
			if err != nil {
				return
			}
			switch c.Method {
			case "unsubscribe":
				f.send(`{"id":` + itoa(c.ID) + `,"unsubscribe":{}}`)
			case "subscribe":
				resubscribeSince.Store(string(c.Params["since"]))
				f.send(`{"id":`+itoa(c.ID)+`,"subscribe":{"epoch":"E","offset":3,"recoverable":true,"recovered":true,"publications":[{"offset":2,"data":"b"},{"offset":3,"data":"c"}]}}`,
					`{"pub":{"channel":"room","offset":4,"data":"d"}}`)
			}
		}
	})
	r := &recorder{}
	opts := recordingOptions(r)
	c, err := New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe("room", SubscribeOptions{
		OnPublication: func(e PublicationEvent) { r.add("pub " + string(e.Data) + " " + itoa(e.Offset)) },
		OnSubscribed: func(e SubscribedEvent) {
			if e.Recovered {
				r.add("subscribed recovered")
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	c.Connect()
	r.wait(t, `pub "d" 4`, 3*time.Second)
	var got []string
	for _, e := range r.all() {
		if strings.HasPrefix(e, "pub ") {
			got = append(got, e)
		}
	}
	want := []string{`pub "a" 1`, `pub "b" 2`, `pub "c" 3`, `pub "d" 4`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	if s, _ := resubscribeSince.Load().(string); s != `{"epoch":"E","offset":1}` {
		t.Fatalf("resubscribed with since %s, want offset 1", s)
	}
}

func TestCloseEndsGoroutines(t *testing.T) {
	url, _ := fakeServer(t, func(f *fakeConn) {
		f.handshake(okConnect)
		for {
			if _, err := f.read(); err != nil {
				return
			}
		}
	})
	r := &recorder{}
	baseline := runtime.NumGoroutine()
	c, err := New(url, recordingOptions(r))
	if err != nil {
		t.Fatal(err)
	}
	c.Connect()
	if err := c.WaitConnected(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("Close took %v", time.Since(start))
	}
	select {
	case <-c.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("Done not closed after Close")
	}
	if r.count("disconnected 1") != 1 {
		t.Fatalf("Close must report one final disconnect: %v", r.all())
	}
	if c.State() != StateDisconnected {
		t.Fatal("state after Close")
	}
	// Every goroutine of the client (and the fake server's handler for it) has ended.
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > baseline {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Close, %d before New:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}

// unsub with a resubscribe code (4003): the client subscribes again with since, without
// an unsubscribe (the server already dropped it), after the subscription's short retry delay, and recovers.
func TestUnsubResubscribeCode(t *testing.T) {
	var commands atomic.Value
	url, _ := fakeServer(t, func(f *fakeConn) {
		c, _ := f.read()
		f.send(`{"id":`+itoa(c.ID)+`,"connect":{"client":"c","node":"n","ping_interval":25,"subs":{"room":{"epoch":"E","offset":5,"recoverable":true}}}}`,
			`{"pub":{"channel":"room","offset":6,"data":6}}`,
			`{"unsub":{"channel":"room","code":4003,"reason":"insufficient state"}}`)
		var seen []string
		for {
			c, err := f.read()
			if err != nil {
				return
			}
			seen = append(seen, c.Method+" "+string(c.Params["since"]))
			commands.Store(strings.Join(seen, "|"))
			if c.Method == "subscribe" {
				f.send(`{"id":` + itoa(c.ID) + `,"subscribe":{"epoch":"E","offset":7,"recoverable":true,"recovered":true,"publications":[{"offset":7,"data":7}]}}`)
			}
		}
	})
	r := &recorder{}
	c, err := New(url, recordingOptions(r))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Subscribe("room", SubscribeOptions{
		OnPublication:  func(e PublicationEvent) { r.add("pub " + string(e.Data)) },
		OnUnsubscribed: func(e UnsubscribedEvent) { r.add("unsubscribed") },
	})
	c.Connect()
	r.wait(t, "pub 7", 3*time.Second)
	if got, _ := commands.Load().(string); got != `subscribe {"epoch":"E","offset":6}` {
		t.Fatalf("commands after unsub 4003: %q", got)
	}
	if r.count("unsubscribed") != 0 || r.count("pub ") != 2 {
		t.Fatalf("events %v", r.all())
	}
}

// TokenFunc: an error is reported and retried with backoff; 109 at connect asks for a new token.
func TestTokenFuncRetriesAndExpiredToken(t *testing.T) {
	var tokensSeen atomic.Value
	url, conns := fakeServer(t, func(f *fakeConn) {
		c, err := f.read()
		if err != nil {
			return
		}
		tok := string(c.Params["token"])
		prev, _ := tokensSeen.Load().(string)
		tokensSeen.Store(prev + tok + " ")
		if tok == `"t1"` {
			f.send(`{"id":` + itoa(c.ID) + `,"error":{"code":109,"message":"token expired"}}`)
			f.ws.Close(4004, "token expired")
			return
		}
		f.send(`{"id":` + itoa(c.ID) + `,"connect":` + okConnect + `}`)
		<-f.ctx.Done()
	})
	var calls atomic.Int32
	r := &recorder{}
	opts := recordingOptions(r)
	opts.TokenFunc = func(ctx context.Context) (string, error) {
		switch calls.Add(1) {
		case 1:
			return "", errors.New("backend down")
		case 2:
			return "t1", nil
		}
		return "t2", nil
	}
	opts.OnError = func(e ErrorEvent) { r.add("error " + e.Type + " " + itoa(uint64(ErrorCode(e.Err)))) }
	newTestClient(t, url, opts)
	r.wait(t, "connected", 3*time.Second)
	if got, _ := tokensSeen.Load().(string); got != `"t1" "t2" ` || conns.Load() != 2 {
		t.Fatalf("tokens sent %q over %d connections", got, conns.Load())
	}
	if r.count("error token 5") != 1 || r.count("error connect 109") != 1 || r.count("disconnected") != 0 {
		t.Fatalf("events %v", r.all())
	}
}

// A token func that returns "" means the user may not connect: the client stops.
func TestTokenFuncNoToken(t *testing.T) {
	url, conns := fakeServer(t, func(f *fakeConn) { f.handshake(okConnect) })
	r := &recorder{}
	opts := recordingOptions(r)
	opts.TokenFunc = func(ctx context.Context) (string, error) { return "", nil }
	newTestClient(t, url, opts)
	r.wait(t, "disconnected 5", 3*time.Second)
	if conns.Load() != 0 {
		t.Fatal("connected without a token")
	}
}

// Server-side subscriptions are named again in the next connect: with since when the channel has
// history (and recovered: true is reported, then the missed publications), without it when not.
func TestServerSideSubscriptionsAcrossReconnect(t *testing.T) {
	var secondSubs atomic.Value
	url, _ := fakeServer(t, func(f *fakeConn) {
		c, err := f.read()
		if err != nil {
			return
		}
		if f.n == 1 {
			f.send(`{"id":`+itoa(c.ID)+`,"connect":{"client":"c","node":"n","ping_interval":25,"subs":{`+
				`"hist":{"epoch":"E","offset":2,"recoverable":true},"nohist":{"epoch":"","offset":0,"recoverable":false}}}}`,
				`{"pub":{"channel":"hist","offset":3,"data":3}}`,
				`{"pub":{"channel":"nohist","offset":0,"data":"a"}}`)
			f.ws.Close(4001, "slow consumer")
			return
		}
		secondSubs.Store(string(c.Params["subs"]))
		f.send(`{"id":` + itoa(c.ID) + `,"connect":{"client":"c2","node":"n","ping_interval":25,"subs":{` +
			`"hist":{"epoch":"E","offset":4,"recoverable":true,"recovered":true,"publications":[{"offset":3,"data":3},{"offset":4,"data":4}]},` +
			`"nohist":{"epoch":"","offset":0,"recoverable":false}}}}`)
		<-f.ctx.Done()
	})
	r := &recorder{}
	opts := recordingOptions(r)
	opts.OnServerSubscribed = func(e ServerSubscribedEvent) {
		r.add("server-subscribed " + e.Channel + " " + map[bool]string{true: "recovering", false: "fresh"}[e.Recovering] +
			" " + map[bool]string{true: "recovered", false: "-"}[e.Recovered])
	}
	newTestClient(t, url, opts)
	r.waitN(t, "connected", 2, 3*time.Second)
	r.wait(t, "serverpub hist 4", 3*time.Second)
	want := `{"hist":{"since":{"epoch":"E","offset":3}},"nohist":{}}`
	if got, _ := secondSubs.Load().(string); got != want {
		t.Fatalf("second connect named %s, want %s", got, want)
	}
	var pubs []string
	for _, e := range r.all() {
		if strings.HasPrefix(e, "serverpub hist") {
			pubs = append(pubs, e)
		}
	}
	if strings.Join(pubs, "|") != "serverpub hist 3|serverpub hist 4" {
		t.Fatalf("hist delivered %v (want 3 then 4, once each)", pubs)
	}
	if r.count("server-subscribed hist recovering recovered") != 1 || r.count("server-subscribed nohist recovering") != 0 {
		t.Fatalf("events %v", r.all())
	}
}
