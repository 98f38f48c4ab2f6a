package herald

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"

	"github.com/centrifugal/fdelta"
)

// DeltaType is a kind of delta compression a subscription can ask for (SubscribeOptions.Delta).
type DeltaType string

// DeltaFossil asks for Fossil deltas (docs/protocol.md, "Delta compression"), the only type.
const DeltaFossil DeltaType = "fossil"

// errDelta: a delta that cannot be turned into the publication's text.
var errDelta = errors.New("herald: delta does not apply")

// deltaBase is the text of the last live publication received in text form: the base of the
// next delta.
type deltaBase struct {
	offset uint64
	text   []byte
}

// applyDelta rebuilds a publication's text from the base text and a Fossil delta, both UTF-8
// bytes on the wire. fdelta.Apply checks the delta's own checksum, so a delta made from another
// base fails here instead of yielding wrong data; limit bounds the output the delta may declare
// (a short delta can ask for a huge one), as a full publication is bounded by the read limit.
func applyDelta(base, delta []byte, limit int64) ([]byte, error) {
	if n, err := fdelta.OutputSize(delta); err != nil || int64(n) > limit {
		return nil, errDelta
	}
	out, err := fdelta.Apply(base, delta)
	if err != nil {
		return nil, errDelta
	}
	return out, nil
}

// undelta makes a publication in text form whole (delta false: data is its JSON text; true: a
// delta against the previous one's). It keeps the result's text as the next base. ok is false
// when that cannot be done (no base for this offset, a delta that does not apply, a result that
// is not JSON): the caller resyncs, which recovers the publication in full.
func (s *Subscription) undelta(p *Publication, isDelta bool) (whole Publication, ok bool) {
	base := s.deltaBase
	s.deltaBase = nil
	var wire string
	if json.Unmarshal(p.Data, &wire) != nil {
		return Publication{}, false
	}
	text := []byte(wire)
	if isDelta {
		if base == nil || base.offset+1 != p.Offset {
			return Publication{}, false
		}
		var err error
		if text, err = applyDelta(base.text, text, s.c.opts.MaxMessageBytes); err != nil {
			return Publication{}, false
		}
	}
	if !utf8.Valid(text) || !json.Valid(text) {
		return Publication{}, false
	}
	// The base is a copy: the app may change the Data it is handed.
	s.deltaBase = &deltaBase{offset: p.Offset, text: bytes.Clone(text)}
	whole = *p
	whole.Data = json.RawMessage(text)
	return whole, true
}
