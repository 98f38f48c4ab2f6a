package herald

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// SubState is a subscription's state.
type SubState int

// A subscription is Subscribing until a subscribe reply (again after each reconnect or resync),
// then Subscribed; Unsubscribed is final.
const (
	SubSubscribing SubState = iota
	SubSubscribed
	SubUnsubscribed
)

func (s SubState) String() string {
	switch s {
	case SubSubscribed:
		return "subscribed"
	case SubUnsubscribed:
		return "unsubscribed"
	}
	return "subscribing"
}

// SubscribeOptions configure one subscription. Every field is optional. The callbacks run on the
// client's event goroutine (see Handlers), in order.
type SubscribeOptions struct {
	// Since resumes from a position stored earlier (Subscription.Position): the first subscribe
	// asks the server for everything after it.
	Since *StreamPosition
	// Token is a subscription token (JWT) for channels that need one.
	Token string
	// TokenFunc is called for a subscription token: before subscribing (when Token is empty),
	// before the token expires (the client then sends sub_refresh), and after the server ended
	// the subscription because it expired (unsub 4004) or refused an expired one (109).
	// Returning "" with a nil error gives up: the subscription ends (CodeNoToken). An error is
	// reported (OnError) and retried. ctx ends when the client is closed.
	TokenFunc func(ctx context.Context, channel string) (string, error)
	// Data is sent with every subscribe of this channel, for the subscribe proxy.
	Data any
	// TagsFilter delivers only the publications whose tags match it, live and in recovery (sent
	// as tf; docs/protocol.md, "Tags and tag filters"). The namespace must set allow_tags_filter
	// (else the subscribe fails with 108; a malformed filter with 107). Offsets then have holes
	// where the filter left publications out, which the subscription does not take for gaps.
	TagsFilter *TagFilter
	// Delta asks for delta compression (DeltaFossil; docs/protocol.md, "Delta compression"): after
	// the first live publication each one comes as a delta against the previous one, which the
	// subscription applies, so OnPublication still gets every publication whole. For channels
	// whose publications are successive versions of one document. The namespace must set
	// allow_delta (else the subscribe fails with 108). A delta that does not apply makes the
	// subscription resubscribe with since, which recovers the publication in full.
	Delta DeltaType

	// OnSubscribed: every subscribe reply (the first, after each reconnect, after a resync).
	OnSubscribed func(SubscribedEvent)
	// OnPublication: every publication, exactly once, in offset order (recovered ones first).
	OnPublication func(PublicationEvent)
	OnJoin        func(PresenceEvent)
	OnLeave       func(PresenceEvent)
	// OnRecoveryFailed: the server could not recover what was missed; reload the app's state.
	// It comes just before the OnSubscribed of the same reply.
	OnRecoveryFailed func(RecoveryFailedEvent)
	// OnUnsubscribed: the subscription ended for good (server unsub, a refusal, Unsubscribe).
	OnUnsubscribed func(UnsubscribedEvent)
	// OnSkipped: the server left publications out (the namespace's backpressure policy); the
	// subscription moves past them without recovering them.
	OnSkipped func(SkippedEvent)
	// OnError: a non-fatal error (a subscribe that will be retried).
	OnError func(SubscriptionErrorEvent)
}

// Subscription is the app's handle on one channel. Its fields are guarded by the client's lock.
type Subscription struct {
	c              *Client
	channel        string
	opts           SubscribeOptions
	state          SubState
	changed        chan struct{} // closed and replaced on every state change (for Ready)
	tracker        *streamTracker
	sentSince      *StreamPosition
	busy           bool // a subscribe (or a resync's unsubscribe) is in flight
	backoff        *Backoff
	retryTimer     *time.Timer
	subscribedOnce bool
	endErr         error
	token          string      // the subscription token to send, if any
	needToken      bool        // the next subscribe must ask TokenFunc first
	fetching       bool        // a TokenFunc call for the next subscribe is under way
	refreshTimer   *time.Timer // sends sub_refresh ahead of the token's expiry
	deltaBase      *deltaBase  // with Delta: the last live publication's text
}

// Subscribe subscribes to a channel. It returns at once; the subscribe is sent when connected
// (inside the connect command when connecting) and restored, with recovery, after every
// reconnect. It fails for an invalid channel name, an unknown Delta type or a channel already
// subscribed.
func (c *Client) Subscribe(channel string, opts SubscribeOptions) (*Subscription, error) {
	if !ValidChannel(channel) {
		return nil, &UsageError{Code: ErrBadRequest, Message: "invalid channel name"}
	}
	if opts.Delta != "" && opts.Delta != DeltaFossil {
		return nil, &UsageError{Code: ErrBadRequest, Message: "unknown delta type " + string(opts.Delta)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, &ConnectionError{Code: CodeClosed, Message: "client is closed"}
	}
	if c.subs[channel] != nil {
		return nil, &UsageError{Code: CodeAlreadySubscribed, Message: "already subscribed to " + channel}
	}
	s := &Subscription{
		c: c, channel: channel, opts: opts, changed: make(chan struct{}),
		tracker: newStreamTracker(opts.Since, opts.TagsFilter != nil),
		backoff: NewBackoff(200*time.Millisecond, 10*time.Second),
		token:   opts.Token, needToken: opts.Token == "" && opts.TokenFunc != nil,
	}
	c.subs[channel] = s
	if c.state == StateConnected {
		c.sendSubscribe(s)
	}
	return s, nil
}

// Subscription returns the active subscription to a channel, or nil.
func (c *Client) Subscription(channel string) *Subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subs[channel]
}

// Channel is the subscription's channel.
func (s *Subscription) Channel() string { return s.channel }

// State is the subscription's state now.
func (s *Subscription) State() SubState {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.state
}

// Position is the last position delivered to the app; store it to resume later with Since.
func (s *Subscription) Position() (StreamPosition, bool) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.tracker.position()
}

// Ready waits until the subscription is active. It fails when ctx ends, when the subscription
// ends, or when the client is disconnected.
func (s *Subscription) Ready(ctx context.Context) error {
	for {
		s.c.mu.Lock()
		st, ch, cst := s.state, s.changed, s.c.state
		endErr := s.endErr
		s.c.mu.Unlock()
		switch {
		case st == SubSubscribed:
			return nil
		case st == SubUnsubscribed:
			return endErr
		case cst == StateDisconnected:
			return &ConnectionError{Code: CodeNotConnected, Message: "client is disconnected"}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Unsubscribe ends the subscription for good (OnUnsubscribed with CodeUnsubscribeCalled).
func (s *Subscription) Unsubscribe() {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subs[s.channel] != s {
		return
	}
	delete(c.subs, s.channel)
	serverKnows := c.state == StateConnected && (s.state == SubSubscribed || s.busy)
	s.end(CodeUnsubscribeCalled, "unsubscribe called", nil)
	if serverKnows {
		c.request("unsubscribe", map[string]any{"channel": s.channel}, func(json.RawMessage, error) {})
	}
}

// Publish publishes to the subscription's channel (Client.Publish).
func (s *Subscription) Publish(ctx context.Context, data any) (PublishResult, error) {
	return s.c.Publish(ctx, s.channel, data)
}

// History reads the channel's history (Client.History).
func (s *Subscription) History(ctx context.Context, opts HistoryOptions) (HistoryResult, error) {
	return s.c.History(ctx, s.channel, opts)
}

// Presence answers who is subscribed to the channel (Client.Presence).
func (s *Subscription) Presence(ctx context.Context) (PresenceResult, error) {
	return s.c.Presence(ctx, s.channel)
}

// --- internal, lock held ---

// sentAlone: subscriptions with a token, data, a tag filter or delta compression are sent one by
// one, never in connect.subs (which takes none of them).
func (s *Subscription) sentAlone() bool {
	return s.opts.Token != "" || s.opts.TokenFunc != nil || s.opts.Data != nil || s.opts.TagsFilter != nil ||
		s.opts.Delta != ""
}

func (s *Subscription) needsSubscribe() bool {
	return s.state == SubSubscribing && !s.busy && !s.fetching && s.retryTimer == nil
}

func (s *Subscription) setState(st SubState) {
	if s.state == st {
		return
	}
	s.state = st
	s.notify()
}

func (s *Subscription) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// subscribeSent: a subscribe is in flight; returns the since to send.
func (s *Subscription) subscribeSent() *StreamPosition {
	since := s.tracker.since()
	s.setState(SubSubscribing)
	s.sentSince = since
	s.busy = true
	return since
}

// applySubscribe delivers a subscribe reply; returns true when a hole means a resync.
func (s *Subscription) applySubscribe(r *SubscribeResult) bool {
	asked := s.sentSince
	s.sentSince = nil
	// A new server-side subscription: its first live publication comes in full.
	s.deltaBase = nil
	out := s.tracker.applySubscribe(r, asked)
	resubscribed := s.subscribedOnce
	s.subscribedOnce = true
	ch := s.channel
	if out.recoveryFailed && asked != nil {
		ev := RecoveryFailedEvent{Channel: ch, Since: *asked, Epoch: r.Epoch, Offset: r.Offset}
		s.emit(func(o *SubscribeOptions) {
			if o.OnRecoveryFailed != nil {
				o.OnRecoveryFailed(ev)
			}
		})
	}
	ev := SubscribedEvent{
		Channel: ch, Epoch: r.Epoch, Offset: r.Offset, Recoverable: r.recoverable(),
		Recovered: out.recovered, Resubscribed: resubscribed, Data: r.Data,
	}
	s.setState(SubSubscribed)
	s.emit(func(o *SubscribeOptions) {
		if o.OnSubscribed != nil {
			o.OnSubscribed(ev)
		}
	})
	for i := range out.publications {
		s.deliver(&out.publications[i])
	}
	return out.gap
}

// applyPublication handles a live publication (delta: its "delta" field, nil when absent); returns
// true when it revealed a hole, or came as a delta that could not be applied. Pushes that arrive
// while (re)subscribing are dropped: the subscribe reply's recovery covers them.
func (s *Subscription) applyPublication(p *Publication, delta *bool) bool {
	if s.state != SubSubscribed {
		return false
	}
	if delta != nil {
		whole, ok := s.undelta(p, *delta)
		if !ok {
			return true
		}
		p = &whole
	} else {
		s.deltaBase = nil // plain data: no delta is made against it
	}
	switch s.tracker.applyPublication(p) {
	case verdictGap:
		return true
	case verdictDeliver:
		s.backoff.Reset()
		s.deliver(p)
	}
	return false
}

// applySkip handles a skip push (the namespace's backpressure policy left from..to out): the
// position moves past them without recovering them, and OnSkipped says so. Returns true when
// from is past the next offset (a hole before the skip: resync to recover it).
func (s *Subscription) applySkip(from, to uint64) bool {
	if s.state != SubSubscribed {
		return false // the subscribe reply's recovery covers it
	}
	switch s.tracker.applySkip(from, to) {
	case verdictGap:
		return true
	case verdictDuplicate:
		return false
	}
	// The publication after a skip comes in full; a delta against the held base would skip the
	// left-out ones, so it must not be used.
	s.deltaBase = nil
	ev := SkippedEvent{Channel: s.channel, From: from, To: to}
	s.emit(func(o *SubscribeOptions) {
		if o.OnSkipped != nil {
			o.OnSkipped(ev)
		}
	})
	return false
}

func (s *Subscription) applyPresence(join bool, ev PresenceEvent) {
	if s.state != SubSubscribed {
		return
	}
	s.emit(func(o *SubscribeOptions) {
		if join && o.OnJoin != nil {
			o.OnJoin(ev)
		} else if !join && o.OnLeave != nil {
			o.OnLeave(ev)
		}
	})
}

func (s *Subscription) deliver(p *Publication) {
	pos, _ := s.tracker.position()
	epoch := ""
	if s.tracker.recoverable {
		epoch = pos.Epoch
	}
	ev := PublicationEvent{Channel: s.channel, Offset: p.Offset, Epoch: epoch, Data: p.Data, Info: p.Info, Tags: p.Tags}
	s.emit(func(o *SubscribeOptions) {
		if o.OnPublication != nil {
			o.OnPublication(ev)
		}
	})
}

func (s *Subscription) connectionLost() {
	s.busy = false
	s.deltaBase = nil
	s.cancelRetry()
	s.c.stopTimer(&s.refreshTimer)
	if s.state == SubSubscribed {
		s.setState(SubSubscribing)
	}
}

func (s *Subscription) retryLater(fn func()) {
	if s.retryTimer != nil {
		return
	}
	s.c.setTimer(&s.retryTimer, s.backoff.Next(0), fn)
}

func (s *Subscription) cancelRetry() { s.c.stopTimer(&s.retryTimer) }

func (s *Subscription) reportError(err error) {
	ev := SubscriptionErrorEvent{Channel: s.channel, Err: err}
	s.emit(func(o *SubscribeOptions) {
		if o.OnError != nil {
			o.OnError(ev)
		}
	})
}

func (s *Subscription) end(code int, reason string, err error) {
	if s.state == SubUnsubscribed {
		return
	}
	s.cancelRetry()
	s.c.stopTimer(&s.refreshTimer)
	if err == nil {
		err = &UsageError{Code: code, Message: "unsubscribed: " + reason}
	} else {
		s.reportError(err)
	}
	s.endErr = err
	s.setState(SubUnsubscribed)
	ev := UnsubscribedEvent{Channel: s.channel, Code: code, Reason: reason}
	s.emit(func(o *SubscribeOptions) {
		if o.OnUnsubscribed != nil {
			o.OnUnsubscribed(ev)
		}
	})
}

func (s *Subscription) emit(f func(o *SubscribeOptions)) {
	o := &s.opts
	s.c.disp.push(func() { f(o) })
}

// --- the client's side of subscriptions (lock held) ---

func (c *Client) sendSubscribe(s *Subscription) {
	if c.state != StateConnected || s.busy || s.fetching || s.state == SubUnsubscribed {
		return
	}
	if s.needToken {
		c.fetchSubscriptionToken(s)
		return
	}
	since := s.subscribeSent()
	p := map[string]any{"channel": s.channel}
	if since != nil {
		p["since"] = since
	}
	if s.token != "" {
		p["token"] = s.token
	}
	if s.opts.Data != nil {
		p["data"] = s.opts.Data
	}
	if s.opts.TagsFilter != nil {
		p["tf"] = s.opts.TagsFilter
	}
	if s.opts.Delta != "" {
		p["delta"] = s.opts.Delta
	}
	c.request("subscribe", p, func(raw json.RawMessage, err error) {
		s.busy = false
		if c.subs[s.channel] != s {
			return // unsubscribed meanwhile
		}
		if err != nil {
			c.onSubscribeError(s, err)
			return
		}
		var r SubscribeResult
		if jerr := json.Unmarshal(raw, &r); jerr != nil {
			c.onSubscribeError(s, &ConnectionError{Code: CodeBadFrame, Message: "bad subscribe reply"})
			return
		}
		c.applySubscribe(s, &r)
	})
}

func (c *Client) applySubscribe(s *Subscription, r *SubscribeResult) {
	if r.ExpiresIn != nil && *r.ExpiresIn > 0 {
		c.scheduleSubRefresh(s, time.Duration(*r.ExpiresIn*float64(time.Second)))
	}
	if s.applySubscribe(r) && c.subs[s.channel] == s {
		c.resync(s, true)
	}
}

func (c *Client) onSubscribeError(s *Subscription, err error) {
	var ce *ConnectionError
	if errors.As(err, &ce) && ce.Code != CodeBadFrame {
		return // the next connect restores it
	}
	var te *TimeoutError
	var re *ReplyError
	if errors.As(err, &re) && re.Code == ErrTokenExpired && s.opts.TokenFunc != nil {
		s.needToken = true
		c.retrySubscribe(s, func() { c.sendSubscribe(s) })
		return
	}
	if errors.As(err, &te) || (errors.As(err, &re) && re.Temporary()) || ce != nil {
		s.reportError(err)
		c.reportError("subscribe", err, s.channel)
		c.retrySubscribe(s, func() { c.sendSubscribe(s) })
		return
	}
	delete(c.subs, s.channel)
	c.reportError("subscribe", err, s.channel)
	s.end(ErrorCode(err), err.Error(), err)
}

// resync re-establishes a channel from the position held, after a hole in the offsets or a
// resubscribe code. If the server still has it subscribed, unsubscribe first.
func (c *Client) resync(s *Subscription, serverSubscribed bool) {
	if s.state == SubSubscribed {
		s.setState(SubSubscribing)
	}
	if c.state != StateConnected || s.busy {
		return
	}
	c.retrySubscribe(s, func() {
		if !serverSubscribed {
			c.sendSubscribe(s)
			return
		}
		s.busy = true
		c.request("unsubscribe", map[string]any{"channel": s.channel}, func(_ json.RawMessage, err error) {
			s.busy = false
			var ce *ConnectionError
			if c.subs[s.channel] != s || errors.As(err, &ce) {
				return
			}
			c.sendSubscribe(s)
		})
	})
}

func (c *Client) retrySubscribe(s *Subscription, fn func()) {
	s.retryLater(func() {
		if c.subs[s.channel] == s && c.state == StateConnected {
			fn()
		}
	})
}

// fetchSubscriptionToken asks the subscription's TokenFunc for a token, then subscribes.
func (c *Client) fetchSubscriptionToken(s *Subscription) {
	if c.closed {
		return
	}
	s.fetching = true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(c.ctx, c.timeout)
		tok, err := s.opts.TokenFunc(ctx, s.channel)
		cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		s.fetching = false
		if c.subs[s.channel] != s {
			return
		}
		switch {
		case err != nil:
			e := &ConnectionError{Code: CodeNoToken, Message: "subscription token func failed: " + err.Error()}
			s.reportError(e)
			c.reportError("subscribe", e, s.channel)
			c.retrySubscribe(s, func() { c.sendSubscribe(s) })
		case tok == "":
			delete(c.subs, s.channel)
			s.end(CodeNoToken, "token func returned no token", nil)
		default:
			s.token, s.needToken = tok, false
			c.sendSubscribe(s)
		}
	}()
}

// scheduleSubRefresh sends sub_refresh ahead of the subscription token's expiry (10 s early, or
// a quarter of a short lifetime). A fixed token cannot be refreshed: the server then ends the
// subscription with unsub 4004 when it expires.
func (c *Client) scheduleSubRefresh(s *Subscription, expiresIn time.Duration) {
	c.stopTimer(&s.refreshTimer)
	if s.opts.TokenFunc == nil {
		return
	}
	delay := max(expiresIn-min(10*time.Second, expiresIn/4), 0)
	c.setTimer(&s.refreshTimer, delay, func() {
		if c.subs[s.channel] != s || s.state != SubSubscribed || c.closed {
			return
		}
		conn := c.conn
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			ctx, cancel := context.WithTimeout(c.ctx, c.timeout)
			tok, err := s.opts.TokenFunc(ctx, s.channel)
			cancel()
			c.mu.Lock()
			defer c.mu.Unlock()
			if err != nil {
				// It will expire: the server sends unsub 4004 and the resubscribe asks again.
				s.needToken = true
				c.reportError("refresh", &ConnectionError{Code: CodeNoToken, Message: "subscription token func failed: " + err.Error()}, s.channel)
				return
			}
			if tok == "" || c.subs[s.channel] != s || s.state != SubSubscribed || c.conn != conn {
				if tok != "" {
					s.token, s.needToken = tok, false
				}
				return
			}
			s.token = tok
			c.request("sub_refresh", map[string]any{"channel": s.channel, "token": tok}, func(raw json.RawMessage, err error) {
				if err != nil {
					var ce *ConnectionError
					if !errors.As(err, &ce) {
						c.reportError("refresh", err, s.channel)
					}
					s.needToken = true
					return
				}
				var r struct {
					ExpiresIn *float64 `json:"expires_in"`
				}
				if json.Unmarshal(raw, &r) == nil && r.ExpiresIn != nil && *r.ExpiresIn > 0 && c.subs[s.channel] == s {
					c.scheduleSubRefresh(s, time.Duration(*r.ExpiresIn*float64(time.Second)))
				}
			})
		}()
	})
}
