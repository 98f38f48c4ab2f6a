package herald

// The skip push (docs/protocol.md, "Pushes"): publications a namespace's backpressure policy
// (conflate, drop_oldest) left out for this connection. The subscription moves past them without
// recovering them, ignores a stale skip, and recovers a hole before one as for any gap.

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// skipServer answers connect with the subscription "room" (epoch E, offset 0) already in it and
// sends frames; it records every command the client sends after, and answers unsubscribe, and
// subscribe with resubscribe (nil: not answered).
func skipServer(t *testing.T, frames []string, resubscribe func(reply string) []string) (url string, sent func() []string) {
	var mu sync.Mutex
	var cmds []string
	url, _ = fakeServer(t, func(f *fakeConn) {
		c, err := f.read()
		if err != nil {
			return
		}
		f.send(append([]string{`{"id":` + itoa(c.ID) + `,"connect":{"client":"c","node":"n","ping_interval":25,` +
			`"subs":{"room":{"epoch":"E","offset":0,"recoverable":true}}}}`}, frames...)...)
		for {
			c, err := f.read()
			if err != nil {
				return
			}
			mu.Lock()
			cmds = append(cmds, c.Method+" since="+string(c.Params["since"]))
			mu.Unlock()
			switch c.Method {
			case "unsubscribe":
				f.send(`{"id":` + itoa(c.ID) + `,"unsubscribe":{}}`)
			case "subscribe":
				if resubscribe != nil {
					f.send(resubscribe(`{"id":` + itoa(c.ID) + `,"subscribe":`)...)
				}
			}
		}
	})
	return url, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), cmds...)
	}
}

func roomPub(offset uint64) string {
	return `{"pub":{"channel":"room","offset":` + itoa(offset) + `,"data":` + itoa(offset) + `}}`
}

func roomSkip(from, to uint64) string {
	return `{"skip":{"channel":"room","from":` + itoa(from) + `,"to":` + itoa(to) + `}}`
}

// subscribeRoom subscribes to "room" before connecting, so that it goes with connect.
func subscribeRoom(t *testing.T, url string, r *recorder) *Subscription {
	t.Helper()
	c, err := New(url, recordingOptions(r))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sub, err := c.Subscribe("room", SubscribeOptions{
		OnPublication: func(e PublicationEvent) { r.add("pub " + itoa(e.Offset)) },
		OnSkipped:     func(e SkippedEvent) { r.add("skipped " + e.Channel + " " + itoa(e.From) + ".." + itoa(e.To)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	return sub
}

func pubsAndSkips(r *recorder) string {
	var got []string
	for _, e := range r.all() {
		if strings.HasPrefix(e, "pub ") || strings.HasPrefix(e, "skipped ") {
			got = append(got, e)
		}
	}
	return strings.Join(got, "|")
}

// Pubs 1..3, skip 4..7, a stale skip (all behind the position), pub 8: delivered 1, 2, 3, 8 with
// one skipped event between, and nothing sent (no unsubscribe/resubscribe).
func TestSkipMovesPastWithoutResync(t *testing.T) {
	url, sent := skipServer(t, []string{
		roomPub(1), roomPub(2), roomPub(3), roomSkip(4, 7), roomSkip(5, 6), roomPub(8), roomSkip(2, 8), roomPub(9),
	}, nil)
	r := &recorder{}
	sub := subscribeRoom(t, url, r)
	r.wait(t, "pub 9", 3*time.Second)
	if got, want := pubsAndSkips(r), "pub 1|pub 2|pub 3|skipped room 4..7|pub 8|pub 9"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	// A resync would be sent within the reconnect delays (at most 50 ms here).
	time.Sleep(300 * time.Millisecond)
	if cmds := sent(); len(cmds) != 0 {
		t.Fatalf("client sent %v after a skip, want nothing", cmds)
	}
	if pos, _ := sub.Position(); pos != (StreamPosition{Epoch: "E", Offset: 9}) {
		t.Fatalf("position %+v, want E/9", pos)
	}
}

// A skip whose from is past the next offset reveals a hole before it (3..4 here): the subscription
// resubscribes with since its position, which recovers them; no skipped event.
func TestSkipPastNextOffsetResyncs(t *testing.T) {
	url, sent := skipServer(t, []string{roomPub(1), roomPub(2), roomSkip(5, 7)}, func(reply string) []string {
		return []string{reply + `{"epoch":"E","offset":7,"recoverable":true,"recovered":true,"publications":[` +
			`{"offset":3,"data":3},{"offset":4,"data":4},{"offset":5,"data":5},{"offset":6,"data":6},{"offset":7,"data":7}]}}`,
			roomPub(8)}
	})
	r := &recorder{}
	subscribeRoom(t, url, r)
	r.wait(t, "pub 8", 3*time.Second)
	if got, want := pubsAndSkips(r), "pub 1|pub 2|pub 3|pub 4|pub 5|pub 6|pub 7|pub 8"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	want := `unsubscribe since=|subscribe since={"epoch":"E","offset":2}`
	if got := strings.Join(sent(), "|"); got != want {
		t.Fatalf("client sent %s, want %s", got, want)
	}
}

// With Delta, the publication after a skip comes in full and the deltas after it apply to it:
// the base held from before the skip is not used.
func TestSkipWithDelta(t *testing.T) {
	var mu sync.Mutex
	var methods []string
	url, _ := fakeServer(t, func(f *fakeConn) {
		f.handshake(okConnect)
		for {
			c, err := f.read()
			if err != nil {
				return
			}
			mu.Lock()
			methods = append(methods, c.Method)
			mu.Unlock()
			if c.Method == "subscribe" && len(methods) == 1 {
				f.send(`{"id":`+itoa(c.ID)+`,"subscribe":{"epoch":"E","offset":4,"recoverable":true,"delta":true}}`,
					pubFrame(5, "false", book1),
					pubFrame(6, "true", delta12),
					`{"skip":{"channel":"book","from":7,"to":9}}`,
					pubFrame(10, "false", book1),
					pubFrame(11, "true", delta12))
			}
		}
	})
	r := &recorder{}
	c := newTestClient(t, url, recordingOptions(r))
	if _, err := c.Subscribe("book", SubscribeOptions{
		Delta:         DeltaFossil,
		OnPublication: func(e PublicationEvent) { r.add("pub " + itoa(e.Offset) + " " + string(e.Data)) },
		OnSkipped:     func(e SkippedEvent) { r.add("skipped " + itoa(e.From) + ".." + itoa(e.To)) },
	}); err != nil {
		t.Fatal(err)
	}
	r.wait(t, "pub 11 ", 3*time.Second)
	want := []string{"pub 5 " + book1, "pub 6 " + book2, "skipped 7..9", "pub 10 " + book1, "pub 11 " + book2}
	var got []string
	for _, e := range r.all() {
		if strings.HasPrefix(e, "pub ") || strings.HasPrefix(e, "skipped ") {
			got = append(got, e)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(methods, " ") != "subscribe" {
		t.Fatalf("client sent %v, want only the first subscribe", methods)
	}
}

// On a server-side subscription a skip moves the position (a stale one does not) and OnSkipped
// says so; the reconnect then recovers from the skip's to.
func TestSkipOnServerSideSubscription(t *testing.T) {
	var secondSubs atomic.Value
	url, _ := fakeServer(t, func(f *fakeConn) {
		c, err := f.read()
		if err != nil {
			return
		}
		if f.n == 1 {
			f.send(`{"id":`+itoa(c.ID)+`,"connect":{"client":"c","node":"n","ping_interval":25,"subs":{`+
				`"hist":{"epoch":"E","offset":2,"recoverable":true}}}}`,
				`{"pub":{"channel":"hist","offset":3,"data":3}}`,
				`{"skip":{"channel":"hist","from":4,"to":6}}`,
				`{"skip":{"channel":"hist","from":5,"to":6}}`,
				`{"skip":{"channel":"other","from":1,"to":9}}`) // not subscribed: ignored
			f.send(`{}`)
			f.read() // the pong: the pushes before it are handled
			f.ws.Close(4001, "slow consumer")
			return
		}
		secondSubs.Store(string(c.Params["subs"]))
		f.send(`{"id":` + itoa(c.ID) + `,"connect":{"client":"c2","node":"n","ping_interval":25,"subs":{` +
			`"hist":{"epoch":"E","offset":7,"recoverable":true,"recovered":true,"publications":[{"offset":7,"data":7}]}}}}`)
		<-f.ctx.Done()
	})
	r := &recorder{}
	opts := recordingOptions(r)
	opts.OnSkipped = func(e SkippedEvent) { r.add("skipped " + e.Channel + " " + itoa(e.From) + ".." + itoa(e.To)) }
	newTestClient(t, url, opts)
	r.wait(t, "serverpub hist 7", 3*time.Second)
	want := `{"hist":{"since":{"epoch":"E","offset":6}}}`
	if got, _ := secondSubs.Load().(string); got != want {
		t.Fatalf("second connect named %s, want %s", got, want)
	}
	var got []string
	for _, e := range r.all() {
		if strings.HasPrefix(e, "serverpub ") || strings.HasPrefix(e, "skipped ") {
			got = append(got, e)
		}
	}
	if strings.Join(got, "|") != "serverpub hist 3|skipped hist 4..6|serverpub hist 7" {
		t.Fatalf("events %v", got)
	}
}
