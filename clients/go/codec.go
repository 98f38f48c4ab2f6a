package herald

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
)

// StreamPosition is where a subscriber stands in a channel's stream.
type StreamPosition struct {
	Epoch  string `json:"epoch"`
	Offset uint64 `json:"offset"`
}

// ClientInfo says who published, joined or left.
type ClientInfo struct {
	User   string `json:"user"`
	Client string `json:"client"`
	// Info is the connection token's info claim, when the publisher had one.
	Info json.RawMessage `json:"info,omitempty"`
}

// Publication as it arrives in history replies and pushes.
type Publication struct {
	// Offset is 0 for a publication kept out of history (skip_history): it has none.
	Offset uint64          `json:"offset"`
	Data   json.RawMessage `json:"data"`
	Info   *ClientInfo     `json:"info,omitempty"`
	// Tags are the publisher's tags, when it set some (docs/protocol.md, "Tags and tag filters").
	Tags map[string]string `json:"tags,omitempty"`
}

// ReplyErrorBody is the {"code", "message"} of an error reply.
type ReplyErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// SubscribeResult is the result of subscribe (and of each channel in connect.subs).
type SubscribeResult struct {
	Epoch        string          `json:"epoch"`
	Offset       uint64          `json:"offset"`
	Recoverable  *bool           `json:"recoverable,omitempty"`
	Recovered    *bool           `json:"recovered,omitempty"`
	Publications []Publication   `json:"publications,omitempty"`
	ExpiresIn    *float64        `json:"expires_in,omitempty"`
	Data         json.RawMessage `json:"data,omitempty"`
	Error        *ReplyErrorBody `json:"error,omitempty"`
}

func (r *SubscribeResult) recoverable() bool { return r.Recoverable == nil || *r.Recoverable }

type connectResult struct {
	Client       string                      `json:"client"`
	Node         string                      `json:"node"`
	PingInterval float64                     `json:"ping_interval"`
	ExpiresIn    *float64                    `json:"expires_in,omitempty"`
	Subs         map[string]*SubscribeResult `json:"subs,omitempty"`
	Data         json.RawMessage             `json:"data,omitempty"`
}

// PublishResult is the stream position a publication got.
type PublishResult struct {
	Epoch  string `json:"epoch"`
	Offset uint64 `json:"offset"`
}

// HistoryResult is a channel's history.
type HistoryResult struct {
	Epoch        string        `json:"epoch"`
	Offset       uint64        `json:"offset"`
	Publications []Publication `json:"publications"`
	// Incomplete: with Since, history no longer holds everything after it (or the epoch differs).
	Incomplete bool `json:"incomplete,omitempty"`
}

// PresenceResult is who is subscribed to a channel now, by client id.
type PresenceResult struct {
	Clients map[string]ClientInfo `json:"clients"`
}

// HistoryOptions for History. Zero values are left out of the request.
type HistoryOptions struct {
	Since *StreamPosition
	Limit int
}

// message kinds decoded from the server.
type msgKind int

const (
	msgInvalid msgKind = iota
	msgReply
	msgPing
	msgPub
	msgJoin
	msgLeave
	msgUnsub
	msgDisconnect
	msgSubscribed
	msgSkip
	msgUnknown
)

type serverMsg struct {
	kind    msgKind
	id      uint64
	result  json.RawMessage
	err     *ReplyErrorBody
	channel string
	pub     Publication
	delta   *bool // a pub's "delta" (delta compression): data is then text, nil when absent
	info    ClientInfo
	code    int
	reason  string
	// disconnect
	reconnect bool
	afterMs   int64 // -1 when absent
	sub       SubscribeResult
	// skip: the offsets left out
	from, to uint64
	bad      string
}

// decodeFrame splits a text frame on "\n" into messages; a bad line becomes msgInvalid and does
// not hide the good ones batched with it.
func decodeFrame(frame []byte) []serverMsg {
	var out []serverMsg
	for _, line := range bytes.Split(frame, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		out = append(out, classify(line))
	}
	return out
}

func classify(line []byte) serverMsg {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil || obj == nil {
		return serverMsg{kind: msgInvalid, bad: "message is not a JSON object"}
	}
	if rawID, ok := obj["id"]; ok {
		var id uint64
		if err := json.Unmarshal(rawID, &id); err != nil || id == 0 {
			return serverMsg{kind: msgInvalid, bad: "reply id is not a positive integer"}
		}
		if rawErr, ok := obj["error"]; ok {
			var e ReplyErrorBody
			if err := json.Unmarshal(rawErr, &e); err != nil {
				return serverMsg{kind: msgInvalid, bad: "bad error body"}
			}
			return serverMsg{kind: msgReply, id: id, err: &e}
		}
		m := serverMsg{kind: msgReply, id: id, result: json.RawMessage("{}")}
		for k, v := range obj {
			if k != "id" {
				m.result = v
			}
		}
		return m
	}
	if len(obj) == 0 {
		return serverMsg{kind: msgPing}
	}
	if raw, ok := obj["pub"]; ok {
		var p struct {
			Channel *string `json:"channel"`
			Delta   *bool   `json:"delta"`
			Publication
		}
		if err := json.Unmarshal(raw, &p); err != nil || p.Channel == nil {
			return serverMsg{kind: msgInvalid, bad: "bad pub"}
		}
		return serverMsg{kind: msgPub, channel: *p.Channel, pub: p.Publication, delta: p.Delta}
	}
	for _, k := range []struct {
		name string
		kind msgKind
	}{{"join", msgJoin}, {"leave", msgLeave}} {
		if raw, ok := obj[k.name]; ok {
			var b struct {
				Channel *string    `json:"channel"`
				Info    ClientInfo `json:"info"`
			}
			if err := json.Unmarshal(raw, &b); err != nil || b.Channel == nil {
				return serverMsg{kind: msgInvalid, bad: "bad " + k.name}
			}
			return serverMsg{kind: k.kind, channel: *b.Channel, info: b.Info}
		}
	}
	if raw, ok := obj["unsub"]; ok {
		var u struct {
			Channel *string `json:"channel"`
			Code    int     `json:"code"`
			Reason  string  `json:"reason"`
		}
		if err := json.Unmarshal(raw, &u); err != nil || u.Channel == nil {
			return serverMsg{kind: msgInvalid, bad: "bad unsub"}
		}
		return serverMsg{kind: msgUnsub, channel: *u.Channel, code: u.Code, reason: u.Reason}
	}
	if raw, ok := obj["subscribe"]; ok {
		var s struct {
			Channel *string `json:"channel"`
			SubscribeResult
		}
		if err := json.Unmarshal(raw, &s); err != nil || s.Channel == nil {
			return serverMsg{kind: msgInvalid, bad: "bad subscribe push"}
		}
		return serverMsg{kind: msgSubscribed, channel: *s.Channel, sub: s.SubscribeResult}
	}
	if raw, ok := obj["skip"]; ok {
		var k struct {
			Channel *string `json:"channel"`
			From    *uint64 `json:"from"`
			To      *uint64 `json:"to"`
		}
		if err := json.Unmarshal(raw, &k); err != nil || k.Channel == nil || k.From == nil || k.To == nil || *k.From > *k.To {
			return serverMsg{kind: msgInvalid, bad: "bad skip"}
		}
		return serverMsg{kind: msgSkip, channel: *k.Channel, from: *k.From, to: *k.To}
	}
	if raw, ok := obj["disconnect"]; ok {
		var d struct {
			Code      int    `json:"code"`
			Reason    string `json:"reason"`
			Reconnect *bool  `json:"reconnect"`
			AfterMs   *int64 `json:"after_ms"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return serverMsg{kind: msgInvalid, bad: "bad disconnect"}
		}
		m := serverMsg{kind: msgDisconnect, code: d.Code, reason: d.Reason, afterMs: -1}
		if d.Reconnect != nil {
			m.reconnect = *d.Reconnect
		} else {
			m.reconnect = ShouldReconnect(d.Code)
		}
		if d.AfterMs != nil && *d.AfterMs >= 0 {
			m.afterMs = *d.AfterMs
		}
		return m
	}
	// Unknown pushes are allowed: newer servers may add them, old clients ignore them.
	return serverMsg{kind: msgUnknown}
}

// encodeCommand encodes {"id": N, "<method>": params}.
func encodeCommand(id uint64, method string, params any) ([]byte, error) {
	p, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("herald: encoding %s params: %w", method, err)
	}
	m, _ := json.Marshal(method)
	return fmt.Appendf(nil, `{"id":%d,%s:%s}`, id, m, p), nil
}

var channelRE = regexp.MustCompile(`^[A-Za-z0-9_:.@=/#,-]{1,255}$`)

// ValidChannel reports whether name is a valid channel name (1 to 255 bytes of [A-Za-z0-9_:.@=/#,-]).
func ValidChannel(name string) bool { return channelRE.MatchString(name) }
