package server_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	herald "github.com/herald-rt/herald/clients/go"
	"github.com/herald-rt/herald/clients/go/internal/heraldtest"
	"github.com/herald-rt/herald/clients/go/server"
)

func decode(t *testing.T, tok string, secret []byte) (header, claims map[string]any) {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %s", tok)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if base64.RawURLEncoding.EncodeToString(mac.Sum(nil)) != parts[2] {
		t.Fatal("bad signature")
	}
	for i, dst := range []*map[string]any{&header, &claims} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil || json.Unmarshal(b, dst) != nil {
			t.Fatalf("part %d: %v", i, err)
		}
	}
	return
}

func TestTokenClaims(t *testing.T) {
	secret := []byte("s3cret")
	exp := time.Now().Add(time.Hour)
	tok, err := server.ConnectionToken(secret, server.ConnectionClaims{
		Subject: "alice", ExpiresAt: exp, Channels: []string{"news"}, Info: map[string]string{"name": "Alice"},
		Audience: "app", Issuer: "backend",
	})
	if err != nil {
		t.Fatal(err)
	}
	h, c := decode(t, tok, secret)
	if h["alg"] != "HS256" || h["typ"] != "JWT" {
		t.Fatalf("header %v", h)
	}
	if c["sub"] != "alice" || c["exp"] != float64(exp.Unix()) || c["aud"] != "app" || c["iss"] != "backend" ||
		c["channels"].([]any)[0] != "news" || c["info"].(map[string]any)["name"] != "Alice" || c["channel"] != nil {
		t.Fatalf("claims %v", c)
	}
	tok, err = server.ConnectionToken(secret, server.ConnectionClaims{})
	if err != nil {
		t.Fatal(err)
	}
	if _, c = decode(t, tok, secret); c["sub"] != "" || c["exp"] != nil || c["channels"] != nil {
		t.Fatalf("anonymous claims %v", c)
	}
	tok, err = server.SubscriptionToken(secret, server.SubscriptionClaims{Subject: "bob", Channel: "private:x", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	if _, c = decode(t, tok, secret); c["sub"] != "bob" || c["channel"] != "private:x" || c["exp"] != float64(exp.Unix()) {
		t.Fatalf("subscription claims %v", c)
	}
	if _, err := server.ConnectionToken(nil, server.ConnectionClaims{}); !errors.Is(err, server.ErrEmptySecret) {
		t.Fatalf("empty secret: %v", err)
	}
	if _, err := server.SubscriptionToken(secret, server.SubscriptionClaims{Channel: "bad name"}); err == nil {
		t.Fatal("invalid channel must fail")
	}
	if _, err := server.ConnectionToken(secret, server.ConnectionClaims{Channels: []string{""}}); err == nil {
		t.Fatal("invalid channel in Channels must fail")
	}
}

type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(s string) { e.mu.Lock(); e.log = append(e.log, s); e.mu.Unlock() }

func (e *events) wait(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		e.mu.Lock()
		for _, s := range e.log {
			if s == want {
				e.mu.Unlock()
				return
			}
		}
		e.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t.Fatalf("no event %q within 5 s; events: %v", want, e.log)
}

func connect(t *testing.T, url string, token string, ev *events) *herald.Client {
	t.Helper()
	c, err := herald.New(url, herald.Options{
		Token: token, MinReconnectDelay: 50 * time.Millisecond, MaxReconnectDelay: 200 * time.Millisecond,
		Handlers: herald.Handlers{
			OnConnected:        func(e herald.ConnectedEvent) { ev.add("connected") },
			OnDisconnected:     func(e herald.DisconnectedEvent) { ev.add("disconnected " + itoa(e.Code)) },
			OnConnecting:       func(e herald.ConnectingEvent) { ev.add("connecting " + itoa(e.Code)) },
			OnServerSubscribed: func(e herald.ServerSubscribedEvent) { ev.add("server-subscribed " + e.Channel) },
			OnUnsubscribed:     func(e herald.UnsubscribedEvent) { ev.add("unsubscribed " + e.Channel + " " + itoa(e.Code)) },
			OnPublication:      func(p herald.PublicationEvent) { ev.add("pub " + p.Channel + " " + string(p.Data)) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.Connect()
	return c
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

const config = `
[[namespaces]]
name = "private"
subscribe = "token"
`

// Minted tokens are accepted by the real server; a token signed with another key is not.
func TestMintedTokensAcceptedByServer(t *testing.T) {
	node := heraldtest.Start(t, config)
	secret := []byte(heraldtest.Secret)
	api, err := server.NewClient(node.HTTP(), heraldtest.APIKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	tok, err := server.ConnectionToken(secret, server.ConnectionClaims{
		Subject: "alice", ExpiresAt: time.Now().Add(time.Hour), Channels: []string{"granted"},
		Info: map[string]string{"name": "Alice"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{}
	c := connect(t, node.WS(), tok, ev)
	ev.wait(t, "connected")
	ev.wait(t, "server-subscribed granted")
	pr, err := api.Presence(ctx, "granted")
	if err != nil || pr.Clients[c.ClientID()].User != "alice" || !strings.Contains(string(pr.Clients[c.ClientID()].Info), "Alice") {
		t.Fatalf("presence: %+v %v", pr, err)
	}

	// A subscription token for a channel of a namespace that needs one.
	stok, err := server.SubscriptionToken(secret, server.SubscriptionClaims{Subject: "alice", Channel: "private:room", ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe("private:room", herald.SubscribeOptions{Token: stok})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Ready(ctx); err != nil {
		t.Fatalf("subscribe with a minted subscription token: %v", err)
	}
	// Without one the same namespace refuses (so the acceptance above means something).
	refused, err := c.Subscribe("private:other", herald.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := refused.Ready(ctx); herald.ErrorCode(err) != herald.ErrPermissionDenied {
		t.Fatalf("subscribe without a token: want 103, got %v", err)
	}
	// A token for another channel is refused too.
	wrong, _ := c.Subscribe("private:third", herald.SubscribeOptions{Token: stok})
	if err := wrong.Ready(ctx); err == nil {
		t.Fatal("a subscription token for another channel was accepted")
	}

	// Signed with another key: refused (101), and the client stops for good.
	bad, _ := server.ConnectionToken([]byte("not-the-secret"), server.ConnectionClaims{Subject: "mallory"})
	ev2 := &events{}
	connect(t, node.WS(), bad, ev2)
	ev2.wait(t, "disconnected 101")
	// Expired: 109; without a token func the client cannot get a new one and stops.
	expired, _ := server.ConnectionToken(secret, server.ConnectionClaims{Subject: "old", ExpiresAt: time.Now().Add(-time.Minute)})
	ev3 := &events{}
	connect(t, node.WS(), expired, ev3)
	ev3.wait(t, "disconnected 109")
}

// Token refresh against the real node: a 3 s token is replaced before it expires through the
// client's TokenFunc, on the same connection.
func TestTokenFuncRefresh(t *testing.T) {
	node := heraldtest.Start(t, "")
	secret := []byte(heraldtest.Secret)
	var mu sync.Mutex
	calls := 0
	ev := &events{}
	c, err := herald.New(node.WS(), herald.Options{
		TokenFunc: func(ctx context.Context) (string, error) {
			mu.Lock()
			calls++
			mu.Unlock()
			return server.ConnectionToken(secret, server.ConnectionClaims{Subject: "carol", ExpiresAt: time.Now().Add(3 * time.Second)})
		},
		Handlers: herald.Handlers{
			OnConnected:  func(herald.ConnectedEvent) { ev.add("connected") },
			OnConnecting: func(e herald.ConnectingEvent) { ev.add("connecting " + itoa(e.Code)) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Connect()
	ev.wait(t, "connected")
	id := c.ClientID()
	time.Sleep(4500 * time.Millisecond) // past the first token's expiry
	mu.Lock()
	n := calls
	mu.Unlock()
	if n < 2 {
		t.Fatalf("token func called %d times, want a refresh", n)
	}
	if c.ClientID() != id || c.State() != herald.StateConnected {
		t.Fatalf("the connection did not survive the first token (events %v)", ev.log)
	}
}

func TestHTTPAPI(t *testing.T) {
	node := heraldtest.Start(t, "")
	secret := []byte(heraldtest.Secret)
	api, err := server.NewClient(node.HTTP(), heraldtest.APIKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok, _ := server.ConnectionToken(secret, server.ConnectionClaims{Subject: "bob"})
	ev := &events{}
	c := connect(t, node.WS(), tok, ev)
	sub, _ := c.Subscribe("feed", herald.SubscribeOptions{
		OnPublication: func(p herald.PublicationEvent) { ev.add("sub " + p.Channel + " " + string(p.Data)) },
	})
	if err := sub.Ready(ctx); err != nil {
		t.Fatal(err)
	}

	r, err := api.Publish(ctx, "feed", map[string]int{"n": 1})
	if err != nil || r.Offset != 1 {
		t.Fatalf("publish: %+v %v", r, err)
	}
	ev.wait(t, `sub feed {"n":1}`)
	r1, err := api.PublishIdempotent(ctx, "feed", 2, "key-1")
	r2, err2 := api.PublishIdempotent(ctx, "feed", 2, "key-1")
	if err != nil || err2 != nil || r1 != r2 || r1.Offset != 2 {
		t.Fatalf("idempotent publish: %+v %+v %v %v", r1, r2, err, err2)
	}
	b1, err := api.Broadcast(ctx, []string{"feed", "other", "bad name"}, "b", "bkey")
	if err != nil || b1.Published != 2 || b1.Failed != 1 || len(b1.Results) != 3 || b1.Results[0].Offset != 3 || b1.Results[2].Error == nil {
		t.Fatalf("broadcast: %+v %v", b1, err)
	}
	b2, err := api.Broadcast(ctx, []string{"feed", "other"}, "b", "bkey")
	if err != nil || b2.Results[0].Offset != 3 || b2.Results[1].Offset != b1.Results[1].Offset {
		t.Fatalf("broadcast retried with the same key must answer the same positions: %+v %v", b2, err)
	}
	h, err := api.History(ctx, "feed", herald.HistoryOptions{Limit: 2})
	if err != nil || h.Offset != 3 || len(h.Publications) != 2 || string(h.Publications[1].Data) != `"b"` {
		t.Fatalf("history: %+v %v", h, err)
	}
	pr, err := api.Presence(ctx, "feed")
	if err != nil || pr.Clients[c.ClientID()].User != "bob" {
		t.Fatalf("presence: %+v %v", pr, err)
	}
	chans, err := api.Channels(ctx)
	if err != nil || chans["feed"].Subscribers != 1 {
		t.Fatalf("channels: %+v %v", chans, err)
	}
	info, err := api.Info(ctx)
	if err != nil || !strings.Contains(string(info), "nodes") {
		t.Fatalf("info: %s %v", info, err)
	}

	// Server-side subscription of the user, then its end.
	if err := api.Subscribe(ctx, "bob", "srv"); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, "server-subscribed srv")
	api.Publish(ctx, "srv", "x")
	ev.wait(t, `pub srv "x"`)
	if err := api.Unsubscribe(ctx, "bob", "srv"); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, "unsubscribed srv 2000")

	// Errors are typed.
	_, err = api.Publish(ctx, "bad name", 1)
	var ae *server.APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != 107 {
		t.Fatalf("bad channel: %v", err)
	}
	wrongKey, _ := server.NewClient(node.HTTP(), "wrong-key", nil)
	if _, err = wrongKey.Publish(ctx, "feed", 1); !errors.As(err, &ae) || ae.Status != 401 || ae.Code != 101 {
		t.Fatalf("wrong key: %v", err)
	}
	if strings.Contains(err.Error(), "wrong-key") {
		t.Fatal("the API key leaked into an error message")
	}
	if _, err := api.PublishIdempotent(ctx, "feed", 1, "has space"); err == nil {
		t.Fatal("a bad idempotency key must be refused before sending")
	}
	if err := api.Disconnect(ctx, server.Disconnect{}); err == nil {
		t.Fatal("Disconnect needs a user or a client")
	}
	if _, err := server.NewClient("127.0.0.1:8000", "", nil); err == nil {
		t.Fatal("a base URL without a scheme must be refused")
	}

	// Disconnect the user: close 4502, the client stops for good.
	if err := api.Disconnect(ctx, server.Disconnect{User: "bob"}); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, "disconnected 4502")
}

// A subscription token func: asked before subscribing, and again before the 3 s token expires
// (sub_refresh), so the subscription outlives its first token without a resubscribe. A fixed
// token that expires ends the subscription instead.
func TestSubscriptionTokenRefresh(t *testing.T) {
	node := heraldtest.Start(t, config)
	secret := []byte(heraldtest.Secret)
	api, _ := server.NewClient(node.HTTP(), heraldtest.APIKey, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conTok, _ := server.ConnectionToken(secret, server.ConnectionClaims{Subject: "erin"})
	ev := &events{}
	c := connect(t, node.WS(), conTok, ev)
	var mu sync.Mutex
	calls := 0
	sub, err := c.Subscribe("private:live", herald.SubscribeOptions{
		TokenFunc: func(ctx context.Context, channel string) (string, error) {
			mu.Lock()
			calls++
			mu.Unlock()
			return server.SubscriptionToken(secret, server.SubscriptionClaims{Subject: "erin", Channel: channel, ExpiresAt: time.Now().Add(3 * time.Second)})
		},
		OnSubscribed:   func(e herald.SubscribedEvent) { ev.add("subscribed " + e.Channel) },
		OnUnsubscribed: func(e herald.UnsubscribedEvent) { ev.add("unsubscribed " + e.Channel + " " + itoa(e.Code)) },
		OnPublication:  func(p herald.PublicationEvent) { ev.add("pub " + p.Channel + " " + string(p.Data)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	fixed, _ := server.SubscriptionToken(secret, server.SubscriptionClaims{Subject: "erin", Channel: "private:fixed", ExpiresAt: time.Now().Add(2 * time.Second)})
	c.Subscribe("private:fixed", herald.SubscribeOptions{
		Token:          fixed,
		OnUnsubscribed: func(e herald.UnsubscribedEvent) { ev.add("unsubscribed " + e.Channel) },
	})
	time.Sleep(4500 * time.Millisecond)
	if _, err := api.Publish(ctx, "private:live", "after"); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, `pub private:live "after"`)
	ev.wait(t, "unsubscribed private:fixed")
	mu.Lock()
	n := calls
	mu.Unlock()
	ev.mu.Lock()
	defer ev.mu.Unlock()
	subscribed := 0
	for _, e := range ev.log {
		if e == "subscribed private:live" {
			subscribed++
		}
		if strings.HasPrefix(e, "unsubscribed private:live") || strings.HasPrefix(e, "connecting ") && e != "connecting 0" {
			t.Fatalf("the subscription or connection was lost: %v", ev.log)
		}
	}
	if n < 2 || subscribed != 1 {
		t.Fatalf("token func called %d times, %d subscribe replies (want a refresh, one subscribe): %v", n, subscribed, ev.log)
	}
}
