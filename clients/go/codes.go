package herald

// Reply error codes (error.code in a command reply), docs/protocol.md.
const (
	ErrInternal               = 100
	ErrUnauthorized           = 101
	ErrUnknownNamespace       = 102
	ErrPermissionDenied       = 103
	ErrUnknownMethod          = 104
	ErrAlreadySubscribed      = 105
	ErrLimitExceeded          = 106
	ErrBadRequest             = 107
	ErrNotAvailable           = 108
	ErrTokenExpired           = 109
	ErrTooManyRequests        = 110
	ErrTemporarilyUnavailable = 111
	// ErrBackendUnavailable: the application's backend (a proxy hook) was unreachable or too slow.
	ErrBackendUnavailable = 112
)

// WebSocket close codes the server uses (the disconnect push repeats them).
// 4000–4499: the client reconnects; 4500–4999: it does not.
const (
	CloseShutdown          = 4000
	CloseSlowConsumer      = 4001
	CloseNoPong            = 4002
	CloseInsufficientState = 4003
	CloseTokenExpired      = 4004
	CloseBackendError      = 4005
	CloseBadRequest        = 4500
	CloseUnauthorized      = 4501
	CloseDisconnectedByAPI = 4502
	CloseMessageTooLarge   = 4503
	CloseConnectionLimit   = 4504
	CloseRefusedByBackend  = 4505
)

// unsub push codes.
const (
	// UnsubServer: the server ended the subscription for good (API unsubscribe).
	UnsubServer = 2000
	// UnsubResubscribe: the node lost the channel's continuity; the SDK subscribes again with since.
	UnsubResubscribe = 4003
	// UnsubTokenExpired: the subscription token expired.
	UnsubTokenExpired = 4004
)

// Codes for things the SDK notices itself. They are below 100 so they never collide with a
// protocol reply code or a close code. They are the same numbers as the JS SDK's ClientCode.
const (
	CodeConnectCalled     = 0  // Connect was called.
	CodeDisconnectCalled  = 1  // Disconnect or Close was called.
	CodeTransportClosed   = 2  // The socket closed without a Herald close code (network drop, 1006 …).
	CodeNoPing            = 3  // Nothing arrived for ping_interval + grace: the connection is presumed dead.
	CodeConnectTimeout    = 4  // The connect command (or the dial) got no answer in time.
	CodeNoToken           = 5  // The token func returned no token, or failed.
	CodeConnectRejected   = 6  // The server refused connect with an error the SDK does not retry.
	CodeTimeout           = 7  // A command got no reply in time.
	CodeConnectionLost    = 8  // The connection went away while a command was in flight.
	CodeNotConnected      = 9  // A call was made while the client is disconnected.
	CodeBadFrame          = 10 // The server sent something the SDK could not parse.
	CodeAlreadySubscribed = 11 // Subscribe was called twice for one channel.
	CodeUnsubscribeCalled = 12 // The subscription was ended by Unsubscribe.
	CodeClosed            = 13 // The client was closed with Close; it cannot be used again.
)

// IsTemporary reports whether a reply error code is worth retrying later: 100, 110, 111, 112.
func IsTemporary(code int) bool {
	return code == ErrInternal || code == ErrTooManyRequests || code == ErrTemporarilyUnavailable ||
		code == ErrBackendUnavailable
}

// ShouldReconnect is the close-code rule of docs/protocol.md: 4500–4999 stay down, everything
// else (4000–4499, and transport codes such as 1000, 1006, 1011) reconnects.
func ShouldReconnect(closeCode int) bool {
	return !(closeCode >= 4500 && closeCode <= 4999)
}

// shouldResubscribe: unsub codes in 4000–4499 mean "subscribe again with since".
func shouldResubscribe(code int) bool {
	return code >= 4000 && code <= 4499
}
