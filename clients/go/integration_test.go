package herald_test

// Tests against the real herald binary (HERALD_BIN, default target/debug/herald at the
// repository root). The conformance suite (clients/conformance) covers faults and recovery; these
// cover the API surface and the README's quick start.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	herald "github.com/herald-rt/herald/clients/go"
	"github.com/herald-rt/herald/clients/go/internal/heraldtest"
)

func TestRealNodeCommands(t *testing.T) {
	node := heraldtest.Start(t, "")
	pubs := make(chan herald.PublicationEvent, 16)
	c, err := herald.New(node.WS(), herald.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe("room", herald.SubscribeOptions{
		OnPublication: func(p herald.PublicationEvent) { pubs <- p },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		r, err := sub.Publish(ctx, map[string]int{"n": i})
		if err != nil || r.Offset != uint64(i) || r.Epoch == "" {
			t.Fatalf("publish %d: %+v %v", i, r, err)
		}
	}
	for i := 1; i <= 3; i++ {
		select {
		case p := <-pubs:
			if p.Offset != uint64(i) || string(p.Data) != `{"n":`+string(rune('0'+i))+`}` || p.Epoch == "" {
				t.Fatalf("publication %d: %+v", i, p)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publication %d not received", i)
		}
	}
	h, err := c.History(ctx, "room", herald.HistoryOptions{Limit: 2})
	if err != nil || len(h.Publications) != 2 || h.Publications[0].Offset != 2 || h.Offset != 3 {
		t.Fatalf("history: %+v %v", h, err)
	}
	pos, ok := sub.Position()
	if !ok || pos.Offset != 3 || pos.Epoch != h.Epoch {
		t.Fatalf("position %+v %v", pos, ok)
	}
	h, err = c.History(ctx, "room", herald.HistoryOptions{Since: &herald.StreamPosition{Epoch: h.Epoch, Offset: 1}})
	if err != nil || len(h.Publications) != 2 || h.Publications[0].Offset != 2 {
		t.Fatalf("history since: %+v %v", h, err)
	}
	p, err := c.Presence(ctx, "room")
	if _, ok := p.Clients[c.ClientID()]; err != nil || !ok {
		t.Fatalf("presence: %+v %v (me %s)", p, err, c.ClientID())
	}
	_, err = c.History(ctx, "bad name!", herald.HistoryOptions{})
	var re *herald.ReplyError
	if !errors.As(err, &re) || re.Code != herald.ErrBadRequest {
		t.Fatalf("bad channel: want ReplyError 107, got %v", err)
	}
	_, err = c.RPC(ctx, "anything", nil)
	if !errors.As(err, &re) || re.Code != herald.ErrNotAvailable {
		t.Fatalf("rpc without a proxy: want 108, got %v", err)
	}
	raw, err := c.Call(ctx, "publish", map[string]any{"channel": "room", "data": 4})
	if err != nil || !bytes.Contains(raw, []byte(`"offset":4`)) {
		t.Fatalf("call: %s %v", raw, err)
	}
	sub.Unsubscribe()
	if sub.State() != herald.SubUnsubscribed || c.Subscription("room") != nil {
		t.Fatal("unsubscribe")
	}
	c.Disconnect()
	if _, err := c.Publish(ctx, "room", 1); herald.ErrorCode(err) != herald.CodeNotConnected {
		t.Fatalf("publish while disconnected: %v", err)
	}
	// Connect again after Disconnect works.
	c.Connect()
	if err := c.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
}

// The README's quick start, as written, against a real node.
func TestReadmeQuickStart(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join("examples", "quickstart", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	block := readme
	if i := bytes.Index(block, []byte("```go\n")); i >= 0 {
		block = block[i+len("```go\n"):]
		if j := bytes.Index(block, []byte("```")); j >= 0 {
			block = block[:j]
		}
	}
	if !bytes.Equal(bytes.TrimSpace(block), bytes.TrimSpace(example)) {
		t.Fatal("README.md's first go block differs from examples/quickstart/main.go; keep them equal")
	}
	node := heraldtest.Start(t, "")
	bin := filepath.Join(t.TempDir(), "quickstart")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/quickstart").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := exec.CommandContext(ctx, bin)
	run.Env = append(os.Environ(), "HERALD_URL="+node.WS())
	run.WaitDelay = time.Second
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("quick start failed: %v\n%s", err, out)
	}
	for _, want := range []string{"connected as ", "published at offset 1", `received {"text":"hello"} at offset 1`} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("quick start output lacks %q:\n%s", want, out)
		}
	}
}

// With compression offered by the client and on at the node, large publications (compressed by
// the server) and commands arrive intact.
func TestRealNodeCompression(t *testing.T) {
	node := heraldtest.Start(t, "", "HERALD_LIMITS__COMPRESSION=true")
	got := make(chan herald.PublicationEvent, 4)
	c, err := herald.New(node.WS(), herald.Options{Compression: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Connect()
	sub, _ := c.Subscribe("big", herald.SubscribeOptions{OnPublication: func(p herald.PublicationEvent) { got <- p }})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	// The offer the client makes (the websocket module's no-context-takeover mode) is one the
	// node accepts, so the option is not a silent no-op.
	ws, resp, err := websocket.Dial(ctx, node.WS(), &websocket.DialOptions{CompressionMode: websocket.CompressionNoContextTakeover})
	if err != nil {
		t.Fatal(err)
	}
	ws.CloseNow()
	if ext := resp.Header.Get("Sec-WebSocket-Extensions"); !strings.Contains(ext, "permessage-deflate") {
		t.Fatalf("compression not negotiated: %q", ext)
	}
	text := strings.Repeat("compressible ", 2000)
	if _, err := c.Publish(ctx, "big", map[string]string{"text": text}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if !strings.Contains(string(p.Data), text) {
			t.Fatalf("publication garbled: %d bytes", len(p.Data))
		}
	case <-ctx.Done():
		t.Fatal("no publication")
	}
}

// Options.Data, Name and Header reach the application's connect hook through the real node; the
// hook's data comes back in ConnectedEvent.Data and its channels as server-side subscriptions.
// A hook's error refuses the connect for good (its code, no retry).
func TestRealNodeConnectProxy(t *testing.T) {
	type hookCall struct {
		Name    string            `json:"name"`
		Data    json.RawMessage   `json:"data"`
		Cookies map[string]string `json:"cookies"`
	}
	calls := make(chan hookCall, 16)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q hookCall
		json.NewDecoder(r.Body).Decode(&q)
		calls <- q
		w.Header().Set("Content-Type", "application/json")
		if q.Cookies["sessionid"] == "good" {
			w.Write([]byte(`{"result":{"user":"dana","data":{"welcome":true},"channels":["inbox"]}}`))
		} else {
			w.Write([]byte(`{"error":{"code":1403,"message":"no session"}}`))
		}
	}))
	defer backend.Close()
	node := heraldtest.Start(t, "[proxy]\nconnect_url = \""+backend.URL+"/connect\"\ncookies = [\"sessionid\"]\n")

	type result struct {
		data   string
		server string
		stop   int
	}
	run := func(cookie string) (result, int) {
		out := make(chan result, 4)
		var attempts int
		c, err := herald.New(node.WS(), herald.Options{
			Name: "go-test", Data: map[string]int{"tab": 2},
			Header:            http.Header{"Cookie": []string{"sessionid=" + cookie}},
			MinReconnectDelay: 20 * time.Millisecond, MaxReconnectDelay: 50 * time.Millisecond,
			Handlers: herald.Handlers{
				OnConnected:        func(e herald.ConnectedEvent) { out <- result{data: string(e.Data)} },
				OnServerSubscribed: func(e herald.ServerSubscribedEvent) { out <- result{server: e.Channel} },
				OnDisconnected:     func(e herald.DisconnectedEvent) { out <- result{stop: e.Code} },
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Connect()
		var r result
		for r.stop == 0 && (r.data == "" || r.server == "") {
			select {
			case e := <-out:
				r.data, r.server, r.stop = r.data+e.data, r.server+e.server, r.stop+e.stop
			case <-time.After(5 * time.Second):
				t.Fatalf("no connect outcome within 5 s: %+v", r)
			}
		}
		time.Sleep(300 * time.Millisecond) // a retry after a refusal would call the hook again
	drain:
		for {
			select {
			case q := <-calls:
				attempts++
				if q.Name != "go-test" || string(q.Data) != `{"tab":2}` {
					t.Fatalf("hook got name %q data %s", q.Name, q.Data)
				}
			default:
				break drain
			}
		}
		return r, attempts
	}
	r, n := run("good")
	if r.data != `{"welcome":true}` || r.server != "inbox" || n != 1 {
		t.Fatalf("accepted connect: %+v after %d hook calls", r, n)
	}
	r, n = run("bad")
	if r.stop != 1403 || n != 1 {
		t.Fatalf("refused connect: stopped with %d after %d hook calls (want 1403, 1)", r.stop, n)
	}
}

// Delta compression against the real node: with allow_delta the publications of one document
// arrive whole and in order while the node computes deltas for them (its
// herald_deltas_computed_total counter rises); without it the subscribe is refused with 108.
func TestRealNodeDelta(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	node := heraldtest.Start(t, "", "HERALD_DEFAULT_NAMESPACE__ALLOW_DELTA=true")
	pubs := make(chan herald.PublicationEvent, 16)
	c, err := herald.New(node.WS(), herald.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Connect()
	sub, err := c.Subscribe("book", herald.SubscribeOptions{
		Delta:         herald.DeltaFossil,
		OnPublication: func(p herald.PublicationEvent) { pubs <- p },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	levels := strings.Repeat("101.5x20 101.4x35 101.3x12 101.2x80 101.1x44 ", 8)
	for i := 1; i <= 4; i++ {
		want := map[string]any{"seq": float64(i), "last": 101 + float64(i)/10, "book": levels, "note": "é日本"}
		if _, err := c.Publish(ctx, "book", want); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-pubs:
			var got map[string]any
			if err := json.Unmarshal(p.Data, &got); err != nil || p.Offset != uint64(i) || !reflect.DeepEqual(got, want) {
				t.Fatalf("publication %d: offset %d, data %s (%v)", i, p.Offset, p.Data, err)
			}
		case <-ctx.Done():
			t.Fatalf("publication %d not received", i)
		}
	}
	// The first comes in full, the three after it as deltas (all smaller than the full text).
	if n := metric(t, node.HTTP(), "herald_deltas_computed_total"); n < 3 {
		t.Fatalf("herald_deltas_computed_total = %v, want at least 3", n)
	}
	if sub.State() != herald.SubSubscribed {
		t.Fatalf("subscription state %v", sub.State())
	}

	plain := heraldtest.Start(t, "")
	ended := make(chan herald.UnsubscribedEvent, 1)
	c2, err := herald.New(plain.WS(), herald.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Connect()
	c2.Subscribe("book", herald.SubscribeOptions{
		Delta:          herald.DeltaFossil,
		OnUnsubscribed: func(e herald.UnsubscribedEvent) { ended <- e },
	})
	select {
	case e := <-ended:
		if e.Code != herald.ErrNotAvailable {
			t.Fatalf("without allow_delta: unsubscribed with %d, want 108", e.Code)
		}
	case <-ctx.Done():
		t.Fatal("without allow_delta: the subscription did not end")
	}
}

// metric reads a counter from a node's /metrics (0 when absent).
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	r, err := hc.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, err := io.ReadAll(r.Body)
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", r.StatusCode, err)
	}
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			sum += v
		}
	}
	return sum
}
