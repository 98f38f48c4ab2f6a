package herald

import "sort"

// pubVerdict: what to do with one live publication.
type pubVerdict int

const (
	verdictDeliver   pubVerdict = iota // next in order: hand it to the app
	verdictDuplicate                   // at or before the position already delivered: drop it
	verdictGap                         // something is missing before it: resubscribe with since
)

type subscribeOutcome struct {
	publications   []Publication // recovered ones to deliver, in order, none delivered before
	recoveryFailed bool          // asked to recover and the server could not
	gap            bool          // the recovered batch ends before the stream's newest offset
	recovered      bool
}

// streamTracker is the recovery bookkeeping of one subscription: the (epoch, offset) handed to
// the app, and the decisions that make delivery exactly-once and in order. No I/O, no locking.
type streamTracker struct {
	epoch       string
	known       bool
	offset      uint64
	recoverable bool
	// filtered: the subscription has a tag filter, so the server leaves out what it does not
	// match and offsets have holes that are no gaps (continuity is the server's: unsub 4003).
	filtered bool
}

func newStreamTracker(since *StreamPosition, filtered bool) *streamTracker {
	t := &streamTracker{filtered: filtered}
	if since != nil {
		t.epoch, t.offset, t.known, t.recoverable = since.Epoch, since.Offset, true, true
	}
	return t
}

// since is the position to send when (re)subscribing, if the channel can be recovered.
func (t *streamTracker) since() *StreamPosition {
	if !t.known || !t.recoverable {
		return nil
	}
	return &StreamPosition{Epoch: t.epoch, Offset: t.offset}
}

func (t *streamTracker) position() (StreamPosition, bool) {
	return StreamPosition{Epoch: t.epoch, Offset: t.offset}, t.known
}

// applySubscribe applies a subscribe result; asked is the since sent with it (nil: fresh).
func (t *streamTracker) applySubscribe(r *SubscribeResult, asked *StreamPosition) subscribeOutcome {
	t.recoverable = r.recoverable()
	if asked == nil {
		t.epoch, t.offset, t.known = r.Epoch, r.Offset, true
		return subscribeOutcome{}
	}
	// A "recovery" across an epoch change contradicts the protocol: offsets of two epochs cannot
	// be compared, so it counts as failed.
	recovered := r.Recovered != nil && *r.Recovered && r.Epoch == asked.Epoch
	if !recovered {
		t.epoch, t.offset, t.known = r.Epoch, r.Offset, true
		return subscribeOutcome{recoveryFailed: true}
	}
	if !t.known || t.epoch != r.Epoch {
		t.epoch, t.offset, t.known = r.Epoch, asked.Offset, true
	}
	pubs := append([]Publication(nil), r.Publications...)
	sort.SliceStable(pubs, func(i, j int) bool { return pubs[i].Offset < pubs[j].Offset })
	var out []Publication
	gap := false
	for _, p := range pubs {
		if p.Offset <= t.offset {
			continue // already delivered
		}
		if p.Offset != t.offset+1 && !t.filtered {
			gap = true // a hole inside the batch: stop before it, resubscribe from here
			break
		}
		out = append(out, p)
		t.offset = p.Offset
	}
	// A filtered recovery ends at its last match; the stream's newest is our position after it.
	if t.filtered && r.Offset > t.offset {
		t.offset = r.Offset
	}
	if !gap && r.Offset > t.offset {
		gap = true
	}
	return subscribeOutcome{publications: out, gap: gap, recovered: true}
}

// applyPublication checks one live publication and advances the position when it is delivered.
func (t *streamTracker) applyPublication(p *Publication) pubVerdict {
	if !t.recoverable || !t.known {
		return verdictDeliver // channels without history have no usable offsets
	}
	if p.Offset == 0 {
		return verdictDeliver // kept out of history (skip_history): live only, the position stays
	}
	if p.Offset <= t.offset {
		return verdictDuplicate
	}
	if p.Offset != t.offset+1 && !t.filtered {
		return verdictGap
	}
	t.offset = p.Offset
	return verdictDeliver
}

// applySkip: the server left from..to out (backpressure) and will not send them; the position
// moves past them. verdictGap when from is past the next offset (a hole before the skip: recover
// it), verdictDuplicate when the skip is all at or behind the position (stale: ignore it).
func (t *streamTracker) applySkip(from, to uint64) pubVerdict {
	if !t.recoverable || !t.known {
		return verdictDeliver
	}
	if to <= t.offset {
		return verdictDuplicate
	}
	if from > t.offset+1 && !t.filtered {
		return verdictGap
	}
	t.offset = to
	return verdictDeliver
}
