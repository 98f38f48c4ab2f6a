// Command herald-conformance-adapter is the Go SDK's adapter for Herald's cross-SDK conformance
// suite (clients/conformance/README.md): commands as JSON lines on stdin, events as JSON lines on
// stdout, logs on stderr. It only translates; reconnecting, backoff, recovery and token refresh
// are the SDK's own behaviour.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	herald "github.com/herald-rt/herald/clients/go"
)

type command struct {
	ID   json.RawMessage `json:"id"`
	Cmd  string          `json:"cmd"`
	Args json.RawMessage `json:"args"`
}

type connectArgs struct {
	URL                 string   `json:"url"`
	Token               *string  `json:"token"`
	Tokens              []string `json:"tokens"`
	MinReconnectDelayMs int64    `json:"min_reconnect_delay_ms"`
	MaxReconnectDelayMs int64    `json:"max_reconnect_delay_ms"`
	TimeoutMs           int64    `json:"timeout_ms"`
	PingGraceMs         int64    `json:"ping_grace_ms"`
}

type channelArgs struct {
	Channel string                 `json:"channel"`
	Since   *herald.StreamPosition `json:"since"`
	Limit   int                    `json:"limit"`
	Data    json.RawMessage        `json:"data"`
	Method  string                 `json:"method"`
	TF      *herald.TagFilter      `json:"tf"`
	Delta   string                 `json:"delta"`
}

type adapter struct {
	t0     time.Time
	outMu  sync.Mutex
	w      *bufio.Writer
	mu     sync.Mutex
	client *herald.Client
	subs   map[string]*herald.Subscription
	tokIdx int
}

func (a *adapter) out(ev map[string]any) {
	ev["t"] = time.Since(a.t0).Milliseconds()
	b, err := json.Marshal(ev)
	if err != nil {
		fmt.Fprintln(os.Stderr, "adapter: cannot encode event:", err)
		return
	}
	a.outMu.Lock()
	a.w.Write(b)
	a.w.WriteByte('\n')
	a.w.Flush()
	a.outMu.Unlock()
}

func (a *adapter) makeClient(args connectArgs) (*herald.Client, error) {
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	opts := herald.Options{
		MinReconnectDelay: ms(args.MinReconnectDelayMs),
		MaxReconnectDelay: ms(args.MaxReconnectDelayMs),
		Timeout:           ms(args.TimeoutMs),
		PingGrace:         ms(args.PingGraceMs),
	}
	if args.Token != nil {
		opts.Token = *args.Token
	}
	if len(args.Tokens) > 0 {
		tokens := args.Tokens
		opts.TokenFunc = func(ctx context.Context) (string, error) {
			a.mu.Lock()
			i := min(a.tokIdx, len(tokens)-1)
			a.tokIdx++
			a.mu.Unlock()
			a.out(map[string]any{"event": "token_requested", "index": i})
			return tokens[i], nil
		}
	}
	opts.OnConnecting = func(e herald.ConnectingEvent) {
		// Code 0: Connect was called; anything else: the connection was lost and it will retry.
		if e.Code != herald.CodeConnectCalled {
			a.out(map[string]any{"event": "disconnected", "code": e.Code, "reconnect": true})
		}
	}
	opts.OnDisconnected = func(e herald.DisconnectedEvent) {
		a.out(map[string]any{"event": "disconnected", "code": e.Code, "reconnect": false})
	}
	opts.OnConnected = func(e herald.ConnectedEvent) {
		a.out(map[string]any{"event": "connected", "client": e.Client})
	}
	opts.OnError = func(e herald.ErrorEvent) {
		ev := map[string]any{"event": "error", "type": e.Type, "code": herald.ErrorCode(e.Err)}
		if e.Channel != "" {
			ev["channel"] = e.Channel
		}
		a.out(ev)
	}
	opts.OnServerSubscribed = func(e herald.ServerSubscribedEvent) {
		if e.Recovering && !e.Recovered {
			a.out(map[string]any{"event": "recovery_failed", "channel": e.Channel})
		}
		a.out(map[string]any{"event": "subscribed", "channel": e.Channel, "server_side": true,
			"epoch": e.Epoch, "offset": e.Offset, "recovered": e.Recovered})
	}
	opts.OnPublication = func(p herald.PublicationEvent) { a.publication(p) }
	opts.OnJoin = func(e herald.PresenceEvent) {
		a.out(map[string]any{"event": "join", "channel": e.Channel, "user": e.Info.User})
	}
	opts.OnLeave = func(e herald.PresenceEvent) {
		a.out(map[string]any{"event": "leave", "channel": e.Channel, "user": e.Info.User})
	}
	opts.OnUnsubscribed = func(e herald.UnsubscribedEvent) {
		a.out(map[string]any{"event": "unsubscribed", "channel": e.Channel, "code": e.Code})
	}
	return herald.New(args.URL, opts)
}

func (a *adapter) publication(p herald.PublicationEvent) {
	ev := map[string]any{"event": "publication", "channel": p.Channel, "offset": p.Offset, "data": p.Data}
	if p.Epoch != "" {
		ev["epoch"] = p.Epoch
	}
	if p.Tags != nil {
		ev["tags"] = p.Tags
	}
	a.out(ev)
}

func (a *adapter) subscribe(c *herald.Client, args channelArgs) error {
	ch := args.Channel
	sub, err := c.Subscribe(ch, herald.SubscribeOptions{
		Since:      args.Since,
		TagsFilter: args.TF,
		Delta:      herald.DeltaType(args.Delta),
		OnSubscribed: func(e herald.SubscribedEvent) {
			a.out(map[string]any{"event": "subscribed", "channel": ch, "server_side": false, "epoch": e.Epoch,
				"offset": e.Offset, "recovered": e.Recovered, "resubscribed": e.Resubscribed})
		},
		OnPublication: a.publication,
		OnRecoveryFailed: func(e herald.RecoveryFailedEvent) {
			a.out(map[string]any{"event": "recovery_failed", "channel": ch, "since": e.Since})
		},
		OnUnsubscribed: func(e herald.UnsubscribedEvent) {
			a.mu.Lock()
			delete(a.subs, ch)
			a.mu.Unlock()
			a.out(map[string]any{"event": "unsubscribed", "channel": ch, "code": e.Code})
		},
		OnJoin: func(e herald.PresenceEvent) {
			a.out(map[string]any{"event": "join", "channel": ch, "user": e.Info.User})
		},
		OnLeave: func(e herald.PresenceEvent) {
			a.out(map[string]any{"event": "leave", "channel": ch, "user": e.Info.User})
		},
		OnError: func(e herald.SubscriptionErrorEvent) {
			a.out(map[string]any{"event": "error", "type": "subscribe", "channel": ch, "code": herald.ErrorCode(e.Err)})
		},
	})
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.subs[ch] = sub
	a.mu.Unlock()
	return nil
}

type codedError struct {
	code int
	msg  string
}

func (e *codedError) Error() string { return e.msg }

func (a *adapter) current() (*herald.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.client == nil {
		return nil, &codedError{-1, "connect first"}
	}
	return a.client, nil
}

func (a *adapter) run(cmd command) (any, error) {
	ctx := context.Background()
	if cmd.Cmd == "connect" {
		var args connectArgs
		if err := json.Unmarshal(cmd.Args, &args); err != nil {
			return nil, &codedError{-3, "bad connect args: " + err.Error()}
		}
		a.mu.Lock()
		if a.client == nil {
			c, err := a.makeClient(args)
			if err != nil {
				a.mu.Unlock()
				return nil, err
			}
			a.client = c
		}
		c := a.client
		a.mu.Unlock()
		return struct{}{}, c.Connect()
	}
	var args channelArgs
	if len(cmd.Args) > 0 {
		if err := json.Unmarshal(cmd.Args, &args); err != nil {
			return nil, &codedError{-3, "bad args: " + err.Error()}
		}
	}
	c, err := a.current()
	if err != nil && cmd.Cmd != "exit" {
		return nil, err
	}
	switch cmd.Cmd {
	case "subscribe":
		return struct{}{}, a.subscribe(c, args)
	case "unsubscribe":
		a.mu.Lock()
		sub := a.subs[args.Channel]
		a.mu.Unlock()
		if sub != nil {
			sub.Unsubscribe()
		}
		return struct{}{}, nil
	case "publish":
		return c.Publish(ctx, args.Channel, args.Data)
	case "history":
		return c.History(ctx, args.Channel, herald.HistoryOptions{Since: args.Since, Limit: args.Limit})
	case "presence":
		return c.Presence(ctx, args.Channel)
	case "rpc":
		var data any
		if len(args.Data) > 0 {
			data = args.Data
		}
		d, err := c.RPC(ctx, args.Method, data)
		if err != nil {
			return nil, err
		}
		return map[string]any{"data": d}, nil
	case "disconnect":
		c.Disconnect()
		return struct{}{}, nil
	}
	return nil, &codedError{-2, "unknown command " + cmd.Cmd}
}

func (a *adapter) answer(id json.RawMessage, result any, err error) {
	if err != nil {
		code := herald.ErrorCode(err)
		if ce, ok := err.(*codedError); ok {
			code = ce.code
		}
		a.out(map[string]any{"event": "result", "id": id, "ok": false,
			"error": map[string]any{"code": code, "message": err.Error()}})
		return
	}
	a.out(map[string]any{"event": "result", "id": id, "ok": true, "result": result})
}

func (a *adapter) shutdown() {
	a.mu.Lock()
	c := a.client
	a.mu.Unlock()
	if c != nil {
		c.Close()
		select { // let the last events reach stdout
		case <-c.Done():
		case <-time.After(time.Second):
		}
	}
}

func main() {
	a := &adapter{t0: time.Now(), w: bufio.NewWriter(os.Stdout), subs: map[string]*herald.Subscription{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	a.out(map[string]any{"event": "ready", "sdk": "go"})
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		var cmd command
		if err := json.Unmarshal(line, &cmd); err != nil {
			a.out(map[string]any{"event": "result", "id": nil, "ok": false,
				"error": map[string]any{"code": -3, "message": "bad JSON"}})
			continue
		}
		if cmd.Cmd == "exit" {
			a.shutdown()
			a.answer(cmd.ID, struct{}{}, nil)
			os.Exit(0)
		}
		go func() {
			res, err := a.run(cmd)
			a.answer(cmd.ID, res, err)
		}()
	}
	a.shutdown()
	os.Exit(0)
}
