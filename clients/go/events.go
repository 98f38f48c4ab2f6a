package herald

import (
	"encoding/json"
	"sync"
	"time"
)

// Handlers are the client's event callbacks. Every field is optional. All callbacks of one
// client (its own and its subscriptions') run on one goroutine, one at a time, in the order the
// events happened; they may call any method of the client (Publish, Subscribe, Disconnect …),
// but a slow callback delays the events behind it (the connection itself is not blocked).
type Handlers struct {
	// OnConnecting: the client is (re)connecting. Code is CodeConnectCalled after Connect, or
	// why the last connection was lost (a close code, a reply error code or a Code… constant);
	// the client retries on its own.
	OnConnecting func(ConnectingEvent)
	// OnConnected: a connect reply arrived; the client is connected.
	OnConnected func(ConnectedEvent)
	// OnDisconnected: the client stopped and will not reconnect on its own (Disconnect, Close, a
	// permanent close code 4500–4999, or a connect refusal). Called once per stop.
	OnDisconnected func(DisconnectedEvent)
	// OnError: a non-fatal problem (a refused connect attempt that will be retried, a failed
	// refresh, a bad frame, a subscription error).
	OnError func(ErrorEvent)
	// OnServerSubscribed: the server subscribed this connection to a channel (token channels
	// claim, the connect proxy, the personal channel, or POST /api/subscribe), or restored it
	// after a reconnect. Its publications, joins and leaves arrive through OnPublication, OnJoin
	// and OnLeave, once each and in offset order.
	OnServerSubscribed func(ServerSubscribedEvent)
	// OnPublication: a publication of a server-side subscription (the app's own subscriptions
	// have SubscribeOptions.OnPublication).
	OnPublication func(PublicationEvent)
	// OnJoin and OnLeave: presence changes on server-side subscriptions.
	OnJoin  func(PresenceEvent)
	OnLeave func(PresenceEvent)
	// OnUnsubscribed: the server ended a server-side subscription for good (code 2000 for the
	// API's unsubscribe).
	OnUnsubscribed func(UnsubscribedEvent)
	// OnSkipped: the server left publications of a server-side subscription out (its namespace's
	// backpressure policy); they are not recovered (the app's own subscriptions have
	// SubscribeOptions.OnSkipped).
	OnSkipped func(SkippedEvent)
}

// ConnectingEvent is passed to OnConnecting.
type ConnectingEvent struct {
	Code   int
	Reason string
}

// ConnectedEvent is passed to OnConnected.
type ConnectedEvent struct {
	Client       string          // the server's id for this connection
	Node         string          // the node's name
	PingInterval time.Duration   // how often the server pings
	ExpiresIn    time.Duration   // until the connection token expires; 0 when it does not
	Data         json.RawMessage // what the connect proxy returned, if anything
}

// DisconnectedEvent is passed to OnDisconnected.
type DisconnectedEvent struct {
	Code   int // close code, refusing reply code, or CodeDisconnectCalled / CodeNoToken
	Reason string
}

// ErrorEvent is passed to OnError. Type is one of "transport", "connect", "token", "refresh",
// "subscribe", "protocol". Channel is set for errors of one channel.
type ErrorEvent struct {
	Type    string
	Err     error
	Channel string
}

// ServerSubscribedEvent is passed to OnServerSubscribed.
type ServerSubscribedEvent struct {
	Channel     string
	Epoch       string
	Offset      uint64
	Recoverable bool
	// Recovering: the SDK asked to recover publications missed while disconnected.
	Recovering bool
	// Recovered: every missed publication was recovered (they follow as OnPublication). When
	// Recovering is true and Recovered false, some were lost: the app must reload its state.
	Recovered bool
}

// PublicationEvent is one publication handed to the app: exactly once, in offset order. Offset is
// 0 for one kept out of history (skip_history): delivered live only, it moves no position.
type PublicationEvent struct {
	Channel string
	Offset  uint64
	// Epoch of the stream the offset belongs to ("" for channels without history).
	Epoch string
	Data  json.RawMessage
	Info  *ClientInfo       // the publisher, when a client published
	Tags  map[string]string // the publisher's tags, when it set some
}

// PresenceEvent is passed to OnJoin / OnLeave.
type PresenceEvent struct {
	Channel string
	Info    ClientInfo
}

// SkippedEvent: publications From..To (offsets) of Channel were left out for this connection by
// the namespace's backpressure policy (conflate or drop_oldest: it read more slowly than they
// came). They are not recovered: the position moves to To and the next publication follows it.
type SkippedEvent struct {
	Channel string
	From    uint64
	To      uint64
}

// UnsubscribedEvent: a subscription ended for good.
type UnsubscribedEvent struct {
	Channel string
	Code    int
	Reason  string
}

// SubscribedEvent is passed to SubscribeOptions.OnSubscribed, for every subscribe reply.
type SubscribedEvent struct {
	Channel     string
	Epoch       string
	Offset      uint64
	Recoverable bool
	// Recovered: missed publications were recovered; they are delivered right after this event.
	Recovered bool
	// Resubscribed: true for every subscribe after the first (reconnects, resyncs).
	Resubscribed bool
	// Data is what the subscribe proxy returned, if anything.
	Data json.RawMessage
}

// RecoveryFailedEvent: the server could not recover missed publications (history no longer
// holds them, or the stream was recreated). The app must reload its state from its own source;
// delivery continues from Epoch/Offset.
type RecoveryFailedEvent struct {
	Channel string
	Since   StreamPosition // what the SDK asked to recover from
	Epoch   string
	Offset  uint64
}

// SubscriptionErrorEvent: a non-fatal error of one subscription (a subscribe that will be retried).
type SubscriptionErrorEvent struct {
	Channel string
	Err     error
}

// dispatcher runs callbacks on one goroutine, in order, from an unbounded queue, so that the
// connection never waits for the app and callbacks may call back into the client.
type dispatcher struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queue  []func()
	closed bool
	done   chan struct{}
}

func newDispatcher() *dispatcher {
	d := &dispatcher{done: make(chan struct{})}
	d.cond = sync.NewCond(&d.mu)
	go d.run()
	return d
}

func (d *dispatcher) push(f func()) {
	d.mu.Lock()
	if !d.closed {
		d.queue = append(d.queue, f)
		d.cond.Signal()
	}
	d.mu.Unlock()
}

// close lets the goroutine deliver what is queued, then end.
func (d *dispatcher) close() {
	d.mu.Lock()
	d.closed = true
	d.cond.Signal()
	d.mu.Unlock()
}

func (d *dispatcher) run() {
	defer close(d.done)
	for {
		d.mu.Lock()
		for len(d.queue) == 0 && !d.closed {
			d.cond.Wait()
		}
		if len(d.queue) == 0 {
			d.mu.Unlock()
			return
		}
		f := d.queue[0]
		d.queue[0] = nil
		d.queue = d.queue[1:]
		d.mu.Unlock()
		f()
	}
}
