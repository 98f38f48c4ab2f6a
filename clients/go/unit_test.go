package herald

import (
	"encoding/json"
	"testing"
	"time"
)

func TestBackoffWindowGrowsAndCaps(t *testing.T) {
	b := NewBackoff(100*time.Millisecond, 800*time.Millisecond)
	b.rand = func() float64 { return 0.999999 }
	want := []time.Duration{100, 200, 400, 800, 800, 800}
	for i, w := range want {
		d := b.Next(0)
		if d < (w-1)*time.Millisecond || d > w*time.Millisecond {
			t.Fatalf("attempt %d: delay %v, want just under %v ms", i, d, w)
		}
	}
	b.Reset()
	if d := b.Next(0); d > 100*time.Millisecond {
		t.Fatalf("after Reset: %v, want the first window again", d)
	}
}

func TestBackoffJitterAndFloor(t *testing.T) {
	b := NewBackoff(time.Second, time.Second)
	b.rand = func() float64 { return 0 }
	if d := b.Next(0); d != 0 {
		t.Fatalf("full jitter may give 0, got %v", d)
	}
	if d := b.Next(1500 * time.Millisecond); d != 1500*time.Millisecond {
		t.Fatalf("after_ms is a floor: got %v", d)
	}
	b = NewBackoff(10*time.Millisecond, 10*time.Millisecond)
	seen := map[time.Duration]bool{}
	for range 50 {
		d := b.Next(0)
		if d < 0 || d >= 10*time.Millisecond {
			t.Fatalf("delay %v out of [0, 10ms)", d)
		}
		seen[d] = true
	}
	if len(seen) < 5 {
		t.Fatalf("delays are not jittered: %v", seen)
	}
}

func TestShouldReconnect(t *testing.T) {
	for code, want := range map[int]bool{
		4000: true, 4001: true, 4002: true, 4003: true, 4004: true, 4005: true, 4499: true,
		4500: false, 4501: false, 4502: false, 4503: false, 4504: false, 4505: false, 4999: false,
		1000: true, 1006: true, CodeTransportClosed: true, CodeNoPing: true,
	} {
		if got := ShouldReconnect(code); got != want {
			t.Errorf("ShouldReconnect(%d) = %v, want %v", code, got, want)
		}
	}
	if !shouldResubscribe(4003) || shouldResubscribe(2000) || shouldResubscribe(4500) {
		t.Error("unsub codes: 4000-4499 resubscribe, others end the subscription")
	}
}

func TestDecodeFrameBatchAndBadLines(t *testing.T) {
	frame := []byte("{\"id\":1,\"connect\":{\"client\":\"c1\"}}\n" +
		"not json\n" +
		"{\"pub\":{\"channel\":\"a\",\"offset\":7,\"data\":{\"x\":1},\"info\":{\"user\":\"u\",\"client\":\"c\"}}}\r\n" +
		"{}\n\n" +
		"{\"disconnect\":{\"code\":4000,\"reason\":\"shutdown\",\"after_ms\":250}}\n" +
		"{\"disconnect\":{\"code\":4502}}\n" +
		"{\"unsub\":{\"channel\":\"a\",\"code\":2000,\"reason\":\"api\"}}\n" +
		"{\"subscribe\":{\"channel\":\"s\",\"epoch\":\"e\",\"offset\":3,\"recoverable\":true}}\n" +
		"{\"id\":2,\"error\":{\"code\":107,\"message\":\"bad\"}}\n" +
		"{\"join\":{\"channel\":\"a\",\"info\":{\"user\":\"bob\",\"client\":\"c2\"}}}\n" +
		"{\"newfangled\":{}}\n" +
		"{\"id\":0,\"x\":{}}")
	ms := decodeFrame(frame)
	kinds := []msgKind{msgReply, msgInvalid, msgPub, msgPing, msgDisconnect, msgDisconnect, msgUnsub,
		msgSubscribed, msgReply, msgJoin, msgUnknown, msgInvalid}
	if len(ms) != len(kinds) {
		t.Fatalf("got %d messages, want %d", len(ms), len(kinds))
	}
	for i, k := range kinds {
		if ms[i].kind != k {
			t.Errorf("message %d: kind %d, want %d", i, ms[i].kind, k)
		}
	}
	if string(ms[0].result) != `{"client":"c1"}` || ms[0].id != 1 {
		t.Errorf("reply: %+v", ms[0])
	}
	if p := ms[2]; p.channel != "a" || p.pub.Offset != 7 || string(p.pub.Data) != `{"x":1}` || p.pub.Info.User != "u" {
		t.Errorf("pub: %+v", p)
	}
	if d := ms[4]; d.code != 4000 || !d.reconnect || d.afterMs != 250 {
		t.Errorf("disconnect 4000: %+v", d)
	}
	if d := ms[5]; d.code != 4502 || d.reconnect || d.afterMs != -1 {
		t.Errorf("disconnect 4502 without reconnect flag must not reconnect: %+v", d)
	}
	if s := ms[7]; s.channel != "s" || s.sub.Epoch != "e" || s.sub.Offset != 3 {
		t.Errorf("subscribe push: %+v", s)
	}
	if e := ms[8]; e.err == nil || e.err.Code != 107 {
		t.Errorf("error reply: %+v", e)
	}
}

func TestEncodeCommand(t *testing.T) {
	b, err := encodeCommand(5, "publish", map[string]any{"channel": "c", "data": json.RawMessage(`{"n":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"id":5,"publish":{"channel":"c","data":{"n":1}}}` {
		t.Fatalf("bad command %s", b)
	}
	if _, err := encodeCommand(1, "publish", map[string]any{"data": func() {}}); err == nil {
		t.Fatal("unencodable params must fail")
	}
}

func TestValidChannel(t *testing.T) {
	for _, ok := range []string{"a", "chat:room-1", "ns:x#alice,bob", "a.b@c=d/e_f"} {
		if !ValidChannel(ok) {
			t.Errorf("%q should be valid", ok)
		}
	}
	long := make([]byte, 256)
	for i := range long {
		long[i] = 'a'
	}
	for _, bad := range []string{"", "bad name", "a{b}", "é", string(long)} {
		if ValidChannel(bad) {
			t.Errorf("%q should be invalid", bad)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func pubs(offsets ...uint64) []Publication {
	var out []Publication
	for _, o := range offsets {
		out = append(out, Publication{Offset: o, Data: json.RawMessage(`1`)})
	}
	return out
}

func TestTrackerFreshThenLive(t *testing.T) {
	tr := newStreamTracker(nil, false)
	if tr.since() != nil {
		t.Fatal("no position yet")
	}
	out := tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 4}, nil)
	if out.recoveryFailed || out.recovered || len(out.publications) != 0 {
		t.Fatalf("fresh: %+v", out)
	}
	if v := tr.applyPublication(&Publication{Offset: 5}); v != verdictDeliver {
		t.Fatalf("5 after 4: %v", v)
	}
	if v := tr.applyPublication(&Publication{Offset: 5}); v != verdictDuplicate {
		t.Fatalf("5 again: %v", v)
	}
	if v := tr.applyPublication(&Publication{Offset: 7}); v != verdictGap {
		t.Fatalf("7 after 5: %v", v)
	}
	if s := tr.since(); s == nil || *s != (StreamPosition{"e1", 5}) {
		t.Fatalf("since %+v", s)
	}
}

func TestTrackerRecovery(t *testing.T) {
	tr := newStreamTracker(&StreamPosition{"e1", 2}, false)
	out := tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 5, Recovered: ptr(true), Publications: pubs(4, 2, 3, 5)}, &StreamPosition{"e1", 2})
	if !out.recovered || out.gap || len(out.publications) != 3 || out.publications[0].Offset != 3 || out.publications[2].Offset != 5 {
		t.Fatalf("recovered 3..5 in order without the duplicate 2: %+v", out)
	}
	// A hole inside the batch: deliver up to it, then resync.
	tr = newStreamTracker(&StreamPosition{"e1", 2}, false)
	out = tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 6, Recovered: ptr(true), Publications: pubs(3, 5, 6)}, &StreamPosition{"e1", 2})
	if !out.gap || len(out.publications) != 1 {
		t.Fatalf("hole: %+v", out)
	}
	// Failed recovery: nothing delivered, position moves to the server's.
	tr = newStreamTracker(&StreamPosition{"e1", 2}, false)
	out = tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 9, Recovered: ptr(false)}, &StreamPosition{"e1", 2})
	if !out.recoveryFailed || len(out.publications) != 0 || *tr.since() != (StreamPosition{"e1", 9}) {
		t.Fatalf("failed recovery: %+v since %+v", out, tr.since())
	}
	// "Recovered" across an epoch change is a failure.
	tr = newStreamTracker(&StreamPosition{"e1", 2}, false)
	out = tr.applySubscribe(&SubscribeResult{Epoch: "e2", Offset: 1, Recovered: ptr(true), Publications: pubs(1)}, &StreamPosition{"e1", 2})
	if !out.recoveryFailed || len(out.publications) != 0 {
		t.Fatalf("epoch change: %+v", out)
	}
	// Not recoverable (no history): no since, everything delivered.
	tr = newStreamTracker(nil, false)
	tr.applySubscribe(&SubscribeResult{Epoch: "", Offset: 0, Recoverable: ptr(false)}, nil)
	if tr.since() != nil || tr.applyPublication(&Publication{Offset: 0}) != verdictDeliver {
		t.Fatal("no history: no recovery, pass through")
	}
}

func TestTrackerPublicationWithoutOffsetMovesNothing(t *testing.T) {
	tr := newStreamTracker(nil, false)
	tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 4}, nil)
	// skip_history: no offset (0), delivered live, the position stays at 4.
	if v := tr.applyPublication(&Publication{Offset: 0}); v != verdictDeliver {
		t.Fatalf("no offset: %v", v)
	}
	if s := tr.since(); *s != (StreamPosition{"e1", 4}) {
		t.Fatalf("since %+v after a publication without offset", s)
	}
	if v := tr.applyPublication(&Publication{Offset: 5}); v != verdictDeliver {
		t.Fatalf("5 after it: %v", v)
	}
}

func TestDecodeSkip(t *testing.T) {
	ms := decodeFrame([]byte(`{"skip":{"channel":"c","from":3,"to":8}}` + "\n" +
		`{"skip":{"channel":"c","from":9,"to":8}}` + "\n" + `{"skip":{"from":1,"to":2}}` + "\n" +
		`{"skip":{"channel":"c","from":1}}` + "\n" + `{"skip":{"channel":"c","from":-1,"to":2}}`))
	if len(ms) != 5 {
		t.Fatalf("got %d messages, want 5", len(ms))
	}
	if k := ms[0]; k.kind != msgSkip || k.channel != "c" || k.from != 3 || k.to != 8 {
		t.Errorf("skip: %+v", k)
	}
	for i, k := range ms[1:] {
		if k.kind != msgInvalid {
			t.Errorf("malformed skip %d: kind %d, want invalid", i+1, k.kind)
		}
	}
}

func TestTrackerSkip(t *testing.T) {
	tr := newStreamTracker(nil, false)
	tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 4}, nil)
	if v := tr.applySkip(5, 9); v != verdictDeliver || *tr.since() != (StreamPosition{"e1", 9}) {
		t.Fatalf("skip 5..9 after 4: %v, since %+v", v, tr.since())
	}
	if v := tr.applyPublication(&Publication{Offset: 10}); v != verdictDeliver {
		t.Fatalf("10 after the skip: %v", v)
	}
	// Overlapping the position (from behind it, to past it) moves it too.
	if v := tr.applySkip(8, 12); v != verdictDeliver || tr.offset != 12 {
		t.Fatalf("skip 8..12 at 10: %v, offset %d", v, tr.offset)
	}
	if v := tr.applySkip(3, 12); v != verdictDuplicate || tr.offset != 12 {
		t.Fatalf("stale skip 3..12 at 12: %v, offset %d", v, tr.offset)
	}
	if v := tr.applySkip(14, 16); v != verdictGap || tr.offset != 12 {
		t.Fatalf("skip 14..16 at 12 (13 missing): %v, offset %d", v, tr.offset)
	}
	// Filtered: holes are no gaps.
	f := newStreamTracker(nil, true)
	f.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 4}, nil)
	if v := f.applySkip(7, 9); v != verdictDeliver || f.offset != 9 {
		t.Fatalf("filtered skip 7..9 at 4: %v, offset %d", v, f.offset)
	}
}

func TestTrackerFilteredHolesAreNoGaps(t *testing.T) {
	tr := newStreamTracker(nil, true)
	tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 4}, nil)
	if v := tr.applyPublication(&Publication{Offset: 7}); v != verdictDeliver {
		t.Fatalf("7 after 4, filtered: %v", v)
	}
	if v := tr.applyPublication(&Publication{Offset: 6}); v != verdictDuplicate {
		t.Fatalf("6 after 7: %v", v)
	}
	// Recovery returns the matches only; the position then is the stream's newest.
	out := tr.applySubscribe(&SubscribeResult{Epoch: "e1", Offset: 12, Recovered: ptr(true), Publications: pubs(9, 11)}, &StreamPosition{"e1", 7})
	if out.gap || len(out.publications) != 2 || *tr.since() != (StreamPosition{"e1", 12}) {
		t.Fatalf("filtered recovery: %+v since %+v", out, tr.since())
	}
}

func TestTagFilterJSON(t *testing.T) {
	f := TagFilter{Op: "and", Nodes: []TagFilter{
		{Key: "kind", Cmp: "eq", Val: ""},
		{Key: "lang", Cmp: "in", Vals: []string{"en", "de"}},
		{Key: "draft", Cmp: "nex"},
		{Op: "not", Nodes: []TagFilter{{Key: "n", Cmp: "gt", Val: "3"}}},
	}}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"nodes":[{"cmp":"eq","key":"kind","val":""},{"cmp":"in","key":"lang","vals":["en","de"]},` +
		`{"cmp":"nex","key":"draft"},{"nodes":[{"cmp":"gt","key":"n","val":"3"}],"op":"not"}],"op":"and"}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	// A node mixing both shapes is sent as it is, for the server to refuse (107).
	b, _ = json.Marshal(TagFilter{Op: "or", Key: "k"})
	if string(b) != `{"key":"k","nodes":[],"op":"or"}` {
		t.Fatalf("mixed: %s", b)
	}
	var back TagFilter
	if err := json.Unmarshal([]byte(`{"key":"k","cmp":"in","vals":["a"]}`), &back); err != nil || back.Cmp != "in" || len(back.Vals) != 1 {
		t.Fatalf("unmarshal: %+v %v", back, err)
	}
}
