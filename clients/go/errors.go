package herald

import (
	"errors"
	"fmt"
)

// ReplyError: the server answered a command with {"error": {code, message}}. Code is a protocol
// code (100–112) or an application code (1000–1999) relayed from a proxy hook.
type ReplyError struct {
	Code    int
	Message string
}

func (e *ReplyError) Error() string { return fmt.Sprintf("herald: error %d: %s", e.Code, e.Message) }

// Temporary reports whether the call is worth retrying later (100, 110, 111, 112).
func (e *ReplyError) Temporary() bool { return IsTemporary(e.Code) }

// TimeoutError: a command got no reply in time. Its effect on the server is unknown.
type TimeoutError struct {
	Method string
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("herald: no reply to %s in time", e.Method)
}

// Timeout is true (net.Error style).
func (e *TimeoutError) Timeout() bool { return true }

// ConnectionError: the connection closed while a command was in flight (Code CodeConnectionLost),
// or the client was disconnected when the call was made (CodeNotConnected, CodeClosed).
// CloseCode is the code the connection ended with, when known.
type ConnectionError struct {
	Code      int
	Message   string
	CloseCode int
}

func (e *ConnectionError) Error() string { return "herald: " + e.Message }

// UsageError: misuse of the API (bad channel name, subscribing twice, bad options).
type UsageError struct {
	Code    int
	Message string
}

func (e *UsageError) Error() string { return "herald: " + e.Message }

// ErrorCode returns the numeric code of any error this package returns (a reply code, close code
// or one of the Code… constants), or -1 for other errors.
func ErrorCode(err error) int {
	var re *ReplyError
	var ce *ConnectionError
	var ue *UsageError
	var te *TimeoutError
	switch {
	case errors.As(err, &re):
		return re.Code
	case errors.As(err, &ce):
		return ce.Code
	case errors.As(err, &ue):
		return ue.Code
	case errors.As(err, &te):
		return CodeTimeout
	}
	return -1
}
