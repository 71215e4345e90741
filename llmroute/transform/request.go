package transform

import (
	"bytes"
	"errors"
)

// Errors returned by ParseRequest. The handler maps both to a 400 response.
var (
	// ErrBadJSON means the body is not a single valid JSON object.
	ErrBadJSON = errors.New("request body is not a valid JSON object")
	// ErrNoModel means the body has no top-level "model" string.
	ErrNoModel = errors.New(`request body has no "model" string`)
)

// ParseRequest validates that body is a single JSON object, with the same
// strictness as encoding/json's json.Valid, and returns its top-level "model"
// (which must be a JSON string) and whether its top-level "stream" is JSON true.
// When a key is repeated, the last occurrence counts, as in encoding/json.
// Invalid JSON or a non-object is ErrBadJSON; a missing or non-string model is
// ErrNoModel. The model's only allocation is the returned string.
func ParseRequest(body []byte) (model string, stream bool, err error) {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return "", false, ErrBadJSON
	}
	it := iterObject(body, i, true)
	var m member
	ms, me := -1, -1
	for it.next(&m) {
		if keyIs(body, &m, "model") {
			ms, me = m.vs, m.ve
		} else if keyIs(body, &m, "stream") {
			stream = string(body[m.vs:m.ve]) == "true"
		}
	}
	if !it.ok || skipWS(body, it.i) != len(body) {
		return "", false, ErrBadJSON
	}
	if ms < 0 || body[ms] != '"' {
		return "", stream, ErrNoModel
	}
	raw := body[ms+1 : me-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), stream, nil
	}
	var tmp [128]byte
	return string(appendUnescape(tmp[:0], raw)), stream, nil
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
	// history (SPEC §7); empty disables the backfill.
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
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return dst, ErrBadJSON
	}
	var h topHooks
	// The encoded model usually fits on the stack.
	var mbuf [128]byte
	if e.Model != "" && !e.Patch.has("model") {
		h.model = appendQuotedString(mbuf[:0], e.Model)
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
	end, ok := skipValue(b, i, false, 0)
	if !ok {
		return len(b)
	}
	return end
}
