package herald

// Delta compression: the Fossil applier on deltas made by the server's Rust crate, and a
// subscription rebuilding live publications from deltas against the fake server, resubscribing
// with since when a delta has no base or does not apply.

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/centrifugal/fdelta"
)

const (
	book1 = `{"symbol":"HRLD-USD","seq":1,"bids":[{"price":"100.00","size":10},{"price":"99.50","size":20},{"price":"99.00","size":30}],"note":"é日本"}`
	book2 = `{"symbol":"HRLD-USD","seq":2,"bids":[{"price":"100.00","size":11},{"price":"99.50","size":20},{"price":"99.00","size":30}],"note":"é日本"}`
	// fossil_delta::delta(book2, book1) and fossil_delta::delta("[1,2,3]", "short"), as the server
	// makes them (the vectors of clients/js/test/unit/fossil.test.ts).
	delta12    = "2D\nR@0,1:2Z@S,1:11D@10,25Lx3M;"
	deltaShort = "7\n7:[1,2,3]27P8_n;"
)

func TestApplyDeltaServerVectors(t *testing.T) {
	for _, v := range []struct{ base, delta, want string }{
		{book1, delta12, book2}, // multi-byte characters included
		{"short", deltaShort, "[1,2,3]"},
	} {
		got, err := applyDelta([]byte(v.base), []byte(v.delta), 1<<20)
		if err != nil || string(got) != v.want {
			t.Fatalf("applyDelta(%q, %q) = %q, %v; want %q", v.base, v.delta, got, err, v.want)
		}
	}
}

func TestApplyDeltaRefusesWrongBaseAndMalformed(t *testing.T) {
	other := strings.Replace(book1, "HRLD", "XXXX", 1) // same length: only the checksum can tell
	// fdelta.Apply itself checks the delta's checksum (not only its structure).
	if _, err := fdelta.Apply([]byte(other), []byte(delta12)); !errors.Is(err, fdelta.ErrChecksumMismatch) {
		t.Fatalf("fdelta.Apply on another base of the same length: %v, want ErrChecksumMismatch", err)
	}
	for _, v := range []struct{ name, base, delta string }{
		{"another base", other, delta12},
		{"a shorter base", book1[:40], delta12},
		{"truncated", book1, "2D\nR@0,"},
		{"no size line", book1, "zz"},
		{"unknown command", book1, "2D\nR?0,"},
		{"empty", book1, ""},
	} {
		if got, err := applyDelta([]byte(v.base), []byte(v.delta), 1<<20); !errors.Is(err, errDelta) {
			t.Errorf("%s: applyDelta = %q, %v; want errDelta", v.name, got, err)
		}
	}
	// A delta may not declare more output than a publication may have.
	if _, err := applyDelta([]byte(book1), []byte(delta12), int64(len(book2)-1)); !errors.Is(err, errDelta) {
		t.Fatalf("output above the limit: %v, want errDelta", err)
	}
}

func TestDeltaOptionChecked(t *testing.T) {
	c, err := New("ws://127.0.0.1:1/ws", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ue *UsageError
	if _, err := c.Subscribe("book", SubscribeOptions{Delta: "xdelta"}); !errors.As(err, &ue) || ue.Code != ErrBadRequest {
		t.Fatalf("unknown delta type: %v", err)
	}
	s, err := c.Subscribe("book", SubscribeOptions{Delta: DeltaFossil})
	if err != nil || !s.sentAlone() {
		t.Fatalf("Delta: %v; sent alone %v", err, s != nil && s.sentAlone())
	}
}

// pubFrame is a live pub push; delta is "" (no delta field: plain data), "false" or "true" (data
// is then text, JSON-encoded as a string).
func pubFrame(offset uint64, delta, data string) string {
	if delta == "" {
		return `{"pub":{"channel":"book","offset":` + itoa(offset) + `,"data":` + data + `}}`
	}
	text, _ := json.Marshal(data)
	return `{"pub":{"channel":"book","offset":` + itoa(offset) + `,"data":` + string(text) + `,"delta":` + delta + `}}`
}

// A subscription with Delta is subscribed alone with delta "fossil" and rebuilds each live
// publication from the text it holds. A delta with no base for it (after a plain publication) and
// one whose checksum fails (made from another base) each make it unsubscribe and subscribe again
// with since, which recovers that publication in full; deltas resume after the next full one.
func TestDeltaSubscriptionRebuildsAndResyncs(t *testing.T) {
	other := strings.Replace(book1, "HRLD", "XXXX", 1)
	var mu sync.Mutex
	var commands []string // what the client sent, with the params that matter here
	url, _ := fakeServer(t, func(f *fakeConn) {
		c, err := f.read()
		if err != nil {
			return
		}
		mu.Lock()
		commands = append(commands, c.Method+" subs="+string(c.Params["subs"]))
		mu.Unlock()
		f.send(`{"id":` + itoa(c.ID) + `,"connect":` + okConnect + `}`)
		subscribes := 0
		for {
			c, err := f.read()
			if err != nil {
				return
			}
			mu.Lock()
			commands = append(commands, c.Method+" delta="+string(c.Params["delta"])+" since="+string(c.Params["since"]))
			mu.Unlock()
			reply := `{"id":` + itoa(c.ID) + `,"` + c.Method + `":`
			if c.Method == "unsubscribe" {
				f.send(reply + `{}}`)
				continue
			}
			subscribes++
			switch subscribes {
			case 1:
				f.send(reply+`{"epoch":"E","offset":4,"recoverable":true,"delta":true}}`,
					pubFrame(5, "false", book1),
					pubFrame(6, "true", delta12),
					// A skip_history publication comes plain (offset 0) and leaves no base behind it,
					pubFrame(0, "", `{"skip":true}`),
					// so this delta has none (held as the base, book2 would rebuild it): resubscribe.
					pubFrame(7, "true", delta12))
			case 2:
				f.send(reply+`{"epoch":"E","offset":7,"recoverable":true,"recovered":true,"delta":true,"publications":[{"offset":7,"data":{"x":7}}]}}`,
					pubFrame(8, "false", other),
					pubFrame(9, "true", delta12)) // made from book1, applied to other: checksum fails
			case 3:
				f.send(reply+`{"epoch":"E","offset":9,"recoverable":true,"recovered":true,"delta":true,"publications":[{"offset":9,"data":{"x":9}}]}}`,
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
		OnError:       func(e SubscriptionErrorEvent) { r.add("suberror " + e.Err.Error()) },
	}); err != nil {
		t.Fatal(err)
	}
	c.Connect()
	r.wait(t, "pub 11 ", 5*time.Second)
	var got []string
	for _, e := range r.all() {
		if strings.HasPrefix(e, "pub ") || strings.HasPrefix(e, "suberror ") {
			got = append(got, e)
		}
	}
	want := []string{
		"pub 5 " + book1, "pub 6 " + book2, `pub 0 {"skip":true}`, `pub 7 {"x":7}`,
		"pub 8 " + other, `pub 9 {"x":9}`, "pub 10 " + book1, "pub 11 " + book2,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("delivered:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	mu.Lock()
	sent := strings.Join(commands, "\n")
	mu.Unlock()
	wantSent := strings.Join([]string{
		"connect subs=", // not in connect.subs: connect takes no delta
		`subscribe delta="fossil" since=`,
		`unsubscribe delta= since=`,
		`subscribe delta="fossil" since={"epoch":"E","offset":6}`,
		`unsubscribe delta= since=`,
		`subscribe delta="fossil" since={"epoch":"E","offset":8}`,
	}, "\n")
	if sent != wantSent {
		t.Fatalf("commands sent:\n%s\nwant:\n%s", sent, wantSent)
	}
}

// A namespace without allow_delta refuses the subscribe with 108: the subscription ends with it,
// without retrying.
func TestDeltaRefused(t *testing.T) {
	var subscribes atomic.Int32
	url, _ := fakeServer(t, func(f *fakeConn) {
		f.handshake(okConnect)
		for {
			c, err := f.read()
			if err != nil {
				return
			}
			if c.Method == "subscribe" {
				f.send(`{"id":` + itoa(c.ID) + `,"error":{"code":108,"message":"not available"}}`)
				subscribes.Add(1)
			}
		}
	})
	r := &recorder{}
	c := newTestClient(t, url, recordingOptions(r))
	c.Subscribe("book", SubscribeOptions{
		Delta:          DeltaFossil,
		OnUnsubscribed: func(e UnsubscribedEvent) { r.add("unsubscribed " + itoa(uint64(e.Code))) },
	})
	c.Connect()
	r.wait(t, "unsubscribed 108", 3*time.Second)
	time.Sleep(300 * time.Millisecond) // past the subscription's first retry delay
	if n := subscribes.Load(); n != 1 || c.Subscription("book") != nil {
		t.Fatalf("%d subscribes (want 1, no retry); still registered: %v", n, c.Subscription("book") != nil)
	}
}
