package herald

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Backoff gives reconnect delays: exponential backoff with full jitter, bounded above. The delay
// for attempt n is uniform in [0, min(max, min·2^n)). A server hint (after_ms) is a floor: the
// client never comes back earlier than asked. Safe for concurrent use.
type Backoff struct {
	mu      sync.Mutex
	min     time.Duration
	max     time.Duration
	attempt int
	rand    func() float64
}

// NewBackoff returns a Backoff with the given window bounds (defaults 500 ms and 20 s when zero).
func NewBackoff(min, max time.Duration) *Backoff {
	if min <= 0 {
		min = 500 * time.Millisecond
	}
	if max <= 0 {
		max = 20 * time.Second
	}
	if max < min {
		max = min
	}
	return &Backoff{min: min, max: max, rand: rand.Float64}
}

// Window is the upper bound of the window for the current attempt.
func (b *Backoff) Window() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.window()
}

func (b *Backoff) window() time.Duration {
	w := float64(b.min) * math.Pow(2, float64(min(b.attempt, 62)))
	if w > float64(b.max) {
		return b.max
	}
	return time.Duration(w)
}

// Next returns the next delay and counts an attempt; floor (a server after_ms) is a minimum.
func (b *Backoff) Next(floor time.Duration) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.window()
	b.attempt++
	d := time.Duration(b.rand() * float64(w))
	if floor > d {
		return floor
	}
	return d
}

// Attempts is the number of delays handed out since the last Reset.
func (b *Backoff) Attempts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.attempt
}

// Reset starts again from the smallest window (after a successful connection).
func (b *Backoff) Reset() {
	b.mu.Lock()
	b.attempt = 0
	b.mu.Unlock()
}
