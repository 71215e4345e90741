package transform

import (
	"bytes"
	"errors"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Errors returned by ParseRequest. The handler maps them to 400 responses.
var (
	// ErrBadJSON means the body is not a single valid JSON object.
	ErrBadJSON = errors.New("request body is not a valid JSON object")
	// ErrNoModel means the body has no top-level "model" string.
	ErrNoModel = errors.New(`request body has no "model" string`)
	// ErrDuplicateKey means the body repeats a top-level key the proxy reads
	// ("model", "stream", "messages"). Parsers disagree on which duplicate
	// wins, so the proxy could route one model while the upstream serves
	// another on the operator's key.
	ErrDuplicateKey = errors.New("request body repeats a top-level key")
)

// ParseRequest validates that body is a single JSON object, with the same
// strictness as encoding/json's json.Valid, and returns its top-level "model"
// (which must be a JSON string) and whether its top-level "stream" is JSON true.
// Invalid JSON or a non-object is ErrBadJSON; a repeated "model", "stream" or
// "messages" is ErrDuplicateKey; a missing or non-string model is ErrNoModel.
// The model's only allocation is the returned string.
func ParseRequest(body []byte) (model string, stream bool, err error) {
	model, stream, _, err = ParseRequestKeys(body, nil, nil)
	return model, stream, err
}

// Spans names top-level members whose values ParseRequestKeys notes in
// its pass ("" unused): a pool's placement reads the prompt from them
// (the first 4), and a router model's rules the effort, user and
// metadata (the last 4), without scanning the body again.
type Spans struct {
	Names [8]string
	// At is each named member's value as body[At[i][0]:At[i][1]]; 0, 0
	// when absent (the last of a repeated member wins).
	At [8][2]int
}

// ParseRequestKeys is ParseRequest that also watches more top-level keys, in
// the same single pass: bit i of dups is set when watch[i] occurs more than
// once (watch entries from index 63 on share bit 63). The caller decides
// which of them matter (the keys the chosen route's patches write). When
// spans is not nil, the values of the members it names are noted in it.
func ParseRequestKeys(body []byte, watch []string, spans *Spans) (model string, stream bool, dups uint64, err error) {
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return "", false, 0, ErrBadJSON
	}
	it := jsonscan.IterObject(body, i, true)
	var m jsonscan.Member
	ms, me := -1, -1
	var seen, seenW uint64
	const seenStream, seenMessages = 1 << 0, 1 << 1
	dup := false
	var tmp [64]byte
	for it.Next(&m) {
		key := body[m.Ks:m.Ke]
		if m.Kesc {
			key = jsonscan.AppendUnescape(tmp[:0], key)
		}
		if spans != nil {
			for i, name := range spans.Names {
				if name != "" && string(key) == name {
					spans.At[i] = [2]int{m.Vs, m.Ve}
				}
			}
		}
		switch string(key) {
		case "model":
			dup = dup || ms >= 0
			ms, me = m.Vs, m.Ve
			continue
		case "stream":
			dup = dup || seen&seenStream != 0
			seen |= seenStream
			stream = string(body[m.Vs:m.Ve]) == "true"
			continue
		case "messages":
			dup = dup || seen&seenMessages != 0
			seen |= seenMessages
			continue
		}
		dups = watchKey(dups, &seenW, watch, key)
	}
	if !it.OK() || jsonscan.SkipWS(body, it.Pos()) != len(body) {
		return "", false, 0, ErrBadJSON
	}
	if dup {
		return "", stream, dups, ErrDuplicateKey
	}
	if ms < 0 || body[ms] != '"' {
		return "", stream, dups, ErrNoModel
	}
	raw := body[ms+1 : me-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), stream, dups, nil
	}
	var mtmp [128]byte
	return string(jsonscan.AppendUnescape(mtmp[:0], raw)), stream, dups, nil
}

// watchKey marks key in seen when it is watched and returns dups with its
// bit set when it was seen before. Past 63 watched keys the bits are shared,
// which can only report a duplicate too many, never one too few.
func watchKey(dups uint64, seen *uint64, watch []string, key []byte) uint64 {
	for i, w := range watch {
		if w != string(key) {
			continue
		}
		bit := uint64(1) << min(i, 63)
		if *seen&bit != 0 {
			dups |= bit
		}
		*seen |= bit
		break
	}
	return dups
}

// RequestEdit is everything done to an outgoing request body, precomputed per
// (model, upstream) and shared read-only between requests.
type RequestEdit struct {
	// Model replaces the top-level "model" value (JSON-encoded here). Empty
	// leaves the client's value. A patch that sets "model" itself wins.
	Model string
	// Patch is provider.patch.Then(upstream.patch).Then(model.patch); nil for
	// none.
	Patch *Patch
	// ReasoningField is the native reasoning field to backfill in assistant
	// history; empty disables the backfill.
	ReasoningField string
	// ReasoningEmptyOK writes "" when an assistant message has no reasoning
	// text at all, instead of leaving the field out.
	ReasoningEmptyOK bool
}

// RewriteRequest appends to dst the final outgoing body: the model swapped,
// the patch merged and the reasoning field backfilled, in that order (the
// backfill sees the patched body). body must have passed ParseRequest; its
// structure is followed without re-validating every byte, and everything the
// edit does not touch is copied verbatim (whitespace, key order, numbers).
//
// The common case is a single pass over the body with no allocation besides
// growing dst. Only when the patch itself writes "messages" does the backfill
// need a second pass over the patched body.
func RewriteRequest(dst, body []byte, e *RequestEdit) ([]byte, error) {
	if e == nil || (e.Model == "" && e.Patch.Empty() && e.ReasoningField == "") {
		return append(dst, body...), nil
	}
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return dst, ErrBadJSON
	}
	var h topHooks
	// The encoded model usually fits on the stack.
	var mbuf [128]byte
	if e.Model != "" && !e.Patch.has("model") {
		h.model = jsonscan.AppendQuoted(mbuf[:0], e.Model)
	}
	twoPass := e.ReasoningField != "" && e.Patch.has("messages")
	if e.ReasoningField != "" && !twoPass {
		h.backfill = e
	}
	if !twoPass {
		start := len(dst)
		dst = append(dst, body[:i]...)
		dst, end, err := e.Patch.applyObject(dst, body, i, &h)
		if err != nil {
			return dst[:start], err
		}
		return append(dst, body[end:]...), nil
	}
	// Rare: the patch replaces "messages", so backfill the patched result.
	tmp, _, err := e.Patch.applyObject(make([]byte, 0, len(body)+64), body, i, &h)
	if err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, body[:i]...)
	dst, _, err = (*Patch)(nil).applyObject(dst, tmp, 0, &topHooks{backfill: e})
	if err != nil {
		return dst[:start], err
	}
	return append(dst, body[skipEnd(body, i):]...), nil
}

// skipEnd returns the index just past the value starting at b[i], or len(b).
func skipEnd(b []byte, i int) int {
	end, ok := jsonscan.SkipValue(b, i, false, 0)
	if !ok {
		return len(b)
	}
	return end
}
