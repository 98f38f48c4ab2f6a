package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	herald "github.com/herald-rt/herald/clients/go"
)

// APIError is an error answer of the HTTP API: {"error": {"code", "message"}} with its status.
type APIError struct {
	Status  int
	Code    int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("herald API: HTTP %d, error %d: %s", e.Status, e.Code, e.Message)
}

// Temporary reports whether the request is worth retrying (429, 503 and codes 100, 110–112).
func (e *APIError) Temporary() bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable || herald.IsTemporary(e.Code)
}

// Client calls a node's HTTP API. Safe for concurrent use.
type Client struct {
	base   string
	apiKey string
	http   *http.Client
}

// NewClient returns a client for a node's base URL (e.g. "http://127.0.0.1:8000") with its API
// key ("" for a --dev node without one). httpClient nil: a client with a 30 s timeout.
func NewClient(baseURL, apiKey string, httpClient *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("herald/server: base URL must be http(s)://host[:port]")
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), apiKey: apiKey, http: httpClient}, nil
}

// PublishResult is where a publication landed.
type PublishResult = herald.PublishResult

// Publish publishes data (any JSON value) to a channel.
func (c *Client) Publish(ctx context.Context, channel string, data any) (PublishResult, error) {
	return c.PublishIdempotent(ctx, channel, data, "")
}

// PublishIdempotent publishes with an idempotency key: retrying with the same key within the
// broker's window answers the first publication's position instead of publishing twice.
func (c *Client) PublishIdempotent(ctx context.Context, channel string, data any, key string) (PublishResult, error) {
	body := map[string]any{"channel": channel, "data": data}
	if err := addKey(body, key); err != nil {
		return PublishResult{}, err
	}
	var r PublishResult
	err := c.post(ctx, "/api/publish", body, &r)
	return r, err
}

// BroadcastItem is one channel's outcome: a position, or Error.
type BroadcastItem struct {
	Epoch  string                 `json:"epoch,omitempty"`
	Offset uint64                 `json:"offset,omitempty"`
	Error  *herald.ReplyErrorBody `json:"error,omitempty"`
}

// BroadcastResult has one item per channel, in the request's order, and the counts.
type BroadcastResult struct {
	Results   []BroadcastItem `json:"results"`
	Published int             `json:"published"`
	Failed    int             `json:"failed"`
}

// Broadcast publishes data to many channels. With an idempotency key, retrying the same call
// publishes only the channels that failed and answers the earlier positions for the others.
func (c *Client) Broadcast(ctx context.Context, channels []string, data any, idempotencyKey string) (BroadcastResult, error) {
	body := map[string]any{"channels": channels, "data": data}
	if err := addKey(body, idempotencyKey); err != nil {
		return BroadcastResult{}, err
	}
	var r BroadcastResult
	err := c.post(ctx, "/api/broadcast", body, &r)
	return r, err
}

// History reads a channel's history.
func (c *Client) History(ctx context.Context, channel string, opts herald.HistoryOptions) (herald.HistoryResult, error) {
	body := map[string]any{"channel": channel}
	if opts.Since != nil {
		body["since"] = opts.Since
	}
	if opts.Limit > 0 {
		body["limit"] = opts.Limit
	}
	var r herald.HistoryResult
	err := c.post(ctx, "/api/history", body, &r)
	return r, err
}

// Presence answers who is subscribed to a channel, by client id.
func (c *Client) Presence(ctx context.Context, channel string) (herald.PresenceResult, error) {
	var r herald.PresenceResult
	err := c.post(ctx, "/api/presence", map[string]any{"channel": channel}, &r)
	return r, err
}

// Disconnect closes a user's connections (User) or one connection (Client); Code is the close
// code (0: the server's default, 4502, which clients do not retry).
type Disconnect struct {
	User   string
	Client string
	Code   int
}

// Disconnect disconnects a user or a client.
func (c *Client) Disconnect(ctx context.Context, d Disconnect) error {
	if (d.User == "") == (d.Client == "") {
		return errors.New("herald/server: Disconnect needs exactly one of User and Client")
	}
	body := map[string]any{}
	if d.User != "" {
		body["user"] = d.User
	} else {
		body["client"] = d.Client
	}
	if d.Code != 0 {
		body["code"] = d.Code
	}
	return c.post(ctx, "/api/disconnect", body, nil)
}

// Subscribe subscribes every connection of a user to a channel (a server-side subscription: the
// client SDK reports it with OnServerSubscribed).
func (c *Client) Subscribe(ctx context.Context, user, channel string) error {
	return c.post(ctx, "/api/subscribe", map[string]any{"user": user, "channel": channel}, nil)
}

// Unsubscribe ends a user's subscription to a channel (the client sees unsub code 2000).
func (c *Client) Unsubscribe(ctx context.Context, user, channel string) error {
	return c.post(ctx, "/api/unsubscribe", map[string]any{"user": user, "channel": channel}, nil)
}

// ChannelInfo is one active channel in Channels.
type ChannelInfo struct {
	Subscribers int `json:"subscribers"`
}

// Channels lists the active channels.
func (c *Client) Channels(ctx context.Context) (map[string]ChannelInfo, error) {
	var r struct {
		Channels map[string]ChannelInfo `json:"channels"`
	}
	err := c.do(ctx, http.MethodGet, "/api/channels", nil, &r)
	return r.Channels, err
}

// Info returns GET /api/info as it is ({"nodes": [...]}).
func (c *Client) Info(ctx context.Context) (json.RawMessage, error) {
	var r json.RawMessage
	err := c.do(ctx, http.MethodGet, "/api/info", nil, &r)
	return r, err
}

func addKey(body map[string]any, key string) error {
	if key == "" {
		return nil
	}
	if len(key) > 128 {
		return errors.New("herald/server: idempotency key longer than 128 bytes")
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] > '~' {
			return errors.New("herald/server: idempotency key must be printable ASCII without spaces")
		}
	}
	body["idempotency_key"] = key
	return nil
}

func (c *Client) post(ctx context.Context, path string, body any, out any) error {
	return c.do(ctx, http.MethodPost, path, body, out)
}

func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("herald/server: encoding %s body: %w", path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("herald/server: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("herald/server: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("herald/server: reading %s answer: %w", path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var e struct {
			Error herald.ReplyErrorBody `json:"error"`
		}
		ae := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			ae.Code, ae.Message = e.Error.Code, e.Error.Message
		} else {
			ae.Message = http.StatusText(resp.StatusCode)
		}
		return ae
	}
	if out == nil || len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("herald/server: bad %s answer: %w", path, err)
	}
	return nil
}
