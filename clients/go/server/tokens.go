// Package server holds the server-side helpers of Herald's Go SDK: a client for the node's HTTP
// API (publish, broadcast, history, presence, disconnect, server-side subscribe/unsubscribe) and
// minting of connection and subscription tokens (HS256 JWTs, docs/protocol.md "Tokens").
//
// These run in the application's backend, which holds the API key and the token secret; never
// ship either to a browser or a mobile app.
package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"time"

	herald "github.com/herald-rt/herald/clients/go"
)

// ConnectionClaims are the claims of a connection token.
type ConnectionClaims struct {
	// Subject is the user id ("" for an anonymous user).
	Subject string
	// ExpiresAt becomes exp; zero: the token never expires (unless the node requires exp).
	ExpiresAt time.Time
	// Channels the server subscribes the connection to at connect (server-side subscriptions).
	Channels []string
	// Info is shown in presence and publications (any JSON value; nil leaves it out).
	Info any
	// Audience and Issuer become aud and iss, for nodes configured with token_audience /
	// token_issuer; empty leaves them out.
	Audience string
	Issuer   string
}

// SubscriptionClaims are the claims of a subscription token, for channels whose namespace
// subscribes with a token.
type SubscriptionClaims struct {
	Subject   string
	Channel   string
	ExpiresAt time.Time
	Audience  string
	Issuer    string
}

// ErrEmptySecret: a token needs a non-empty HMAC secret.
var ErrEmptySecret = errors.New("herald/server: empty token secret")

// ConnectionToken mints an HS256 connection token signed with secret (the node's
// token_hmac_secret). Claims: sub, exp?, channels?, info?, aud?, iss?, iat.
func ConnectionToken(secret []byte, c ConnectionClaims) (string, error) {
	for _, ch := range c.Channels {
		if !herald.ValidChannel(ch) {
			return "", errors.New("herald/server: invalid channel name in Channels")
		}
	}
	claims := map[string]any{"sub": c.Subject}
	if len(c.Channels) > 0 {
		claims["channels"] = c.Channels
	}
	if c.Info != nil {
		claims["info"] = c.Info
	}
	return sign(secret, claims, c.ExpiresAt, c.Audience, c.Issuer)
}

// SubscriptionToken mints an HS256 subscription token for one channel: sub, channel, exp?, aud?,
// iss?, iat.
func SubscriptionToken(secret []byte, c SubscriptionClaims) (string, error) {
	if !herald.ValidChannel(c.Channel) {
		return "", errors.New("herald/server: a subscription token needs a valid Channel")
	}
	claims := map[string]any{"sub": c.Subject, "channel": c.Channel}
	return sign(secret, claims, c.ExpiresAt, c.Audience, c.Issuer)
}

func sign(secret []byte, claims map[string]any, exp time.Time, aud, iss string) (string, error) {
	if len(secret) == 0 {
		return "", ErrEmptySecret
	}
	claims["iat"] = time.Now().Unix()
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	if aud != "" {
		claims["aud"] = aud
	}
	if iss != "" {
		claims["iss"] = iss
	}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", errors.New("herald/server: claims are not JSON: " + err.Error())
	}
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	signing := head + "." + enc.EncodeToString(body)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signing))
	return signing + "." + enc.EncodeToString(mac.Sum(nil)), nil
}
