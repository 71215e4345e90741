package transform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Patch is a compiled deep-merge patch: for every key of the patch
// object, an object value is merged recursively into the body's value when
// that is an object too, and any other value (scalar, array, null) replaces the
// body's value. Keys the body lacks are appended after its existing keys, in
// patch order; existing keys keep their place.
//
// A Patch is an ordered list of per-key operations: Set(raw JSON) or
// Merge(child Patch). That representation lets Then compose two patches into
// one that behaves exactly like applying them one after the other, which a
// plain merged JSON object could not (see Then).
//
// A nil *Patch is valid and does nothing. Patches are immutable after
// compilation and safe for concurrent use.
type Patch struct {
	ops []patchOp
}

// patchOp is the operation on one key.
type patchOp struct {
	key    string // decoded key, compared against decoded body keys
	rawKey []byte // the key as written in the patch (quoted), used when appending
	set    []byte // Set: compact raw JSON value; nil for Merge
	sub    *Patch // Merge: operations on the child object
	mat    []byte // Merge: the value written when the body value is missing or not an object
}

// errPatchNotObject is returned by CompilePatch for a non-object patch.
var errPatchNotObject = errors.New("patch must be a JSON object")

// CompilePatch compiles a JSON object into a Patch. Empty input, "null" and an
// object without keys compile to nil (no-op). Anything that is not a JSON
// object is an error. Values are stored compacted. When the patch repeats a
// key, the last value wins (as with encoding/json) and takes the place of the
// first occurrence.
func CompilePatch(raw []byte) (*Patch, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if !jsonscan.Valid(raw) {
		return nil, fmt.Errorf("patch is not valid JSON")
	}
	if raw[0] != '{' {
		return nil, errPatchNotObject
	}
	p, err := compileObject(raw, 0)
	if err != nil {
		return nil, err
	}
	if p.Empty() {
		return nil, nil
	}
	return p, nil
}

func compileObject(b []byte, start int) (*Patch, error) {
	p := &Patch{}
	it := jsonscan.IterObject(b, start, false)
	var m jsonscan.Member
	for it.Next(&m) {
		key := string(jsonscan.AppendUnescape(nil, b[m.Ks:m.Ke]))
		// Keep the key as the patch wrote it: re-encoding could change it
		// (invalid UTF-8 becomes U+FFFD) so that a later patch no longer
		// matches the key an earlier one appended.
		op := patchOp{key: key, rawKey: bytes.Clone(b[m.Ks-1 : m.Ke+1])}
		if b[m.Vs] == '{' {
			sub, err := compileObject(b, m.Vs)
			if err != nil {
				return nil, err
			}
			op.sub = sub
			op.mat = sub.materialize()
		} else {
			var buf bytes.Buffer
			if err := json.Compact(&buf, b[m.Vs:m.Ve]); err != nil {
				return nil, err
			}
			op.set = buf.Bytes()
		}
		if i := p.index(key); i >= 0 {
			p.ops[i] = op
		} else {
			p.ops = append(p.ops, op)
		}
	}
	if !it.OK() {
		return nil, errors.New("patch is not valid JSON")
	}
	return p, nil
}

// Empty reports whether applying p never changes anything.
func (p *Patch) Empty() bool { return p == nil || len(p.ops) == 0 }

func (p *Patch) index(key string) int {
	if p == nil {
		return -1
	}
	for i := range p.ops {
		if p.ops[i].key == key {
			return i
		}
	}
	return -1
}

// Keys returns the top-level keys p writes, in patch order.
func (p *Patch) Keys() []string {
	if p == nil {
		return nil
	}
	keys := make([]string, len(p.ops))
	for i := range p.ops {
		keys[i] = p.ops[i].key
	}
	return keys
}

// has reports whether p has an operation on the top-level key.
func (p *Patch) has(key string) bool { return p.index(key) >= 0 }

// materialize returns the object p produces from an empty object.
func (p *Patch) materialize() []byte {
	out, _, _ := p.applyObject(nil, []byte("{}"), 0, nil)
	return out
}

// Then returns a patch that is exactly equivalent to applying p and then q.
//
// Deep merge is not associative, so q cannot simply be merged into p: if p sets
// "a" to a scalar and q merges an object into "a", sequential application
// replaces the scalar with q's object wholesale, whereas merging the two patch
// objects first would merge q's object into the body's "a". Then therefore
// composes per key: Set then Merge becomes a Set of the merged constant, Merge
// then Merge composes the children recursively, and a later Set wins. The
// result keeps the key order sequential application would produce. Either
// argument may be nil; inputs are not modified.
func (p *Patch) Then(q *Patch) *Patch {
	if q.Empty() {
		return p
	}
	if p.Empty() {
		return q
	}
	r := &Patch{ops: make([]patchOp, len(p.ops), len(p.ops)+len(q.ops))}
	copy(r.ops, p.ops)
	for _, qop := range q.ops {
		i := r.index(qop.key)
		if i < 0 {
			r.ops = append(r.ops, qop)
			continue
		}
		pop := r.ops[i]
		switch {
		case qop.sub == nil: // q sets: whatever p did is overwritten
			r.ops[i] = patchOp{key: pop.key, rawKey: pop.rawKey, set: qop.set}
		case pop.sub == nil: // p set a constant, q merges into it
			var v []byte
			if pop.set[0] == '{' {
				v, _, _ = qop.sub.applyObject(nil, pop.set, 0, nil)
			} else {
				v = qop.mat
			}
			r.ops[i] = patchOp{key: pop.key, rawKey: pop.rawKey, set: v}
		default: // both merge: after p the value is always an object
			sub := pop.sub.Then(qop.sub)
			r.ops[i] = patchOp{key: pop.key, rawKey: pop.rawKey, sub: sub, mat: sub.materialize()}
		}
	}
	return r
}

// Apply appends to dst the JSON object body with p merged into it. body must
// be a JSON object (optionally surrounded by whitespace, which is kept); it is
// assumed valid (see ParseRequest) and only its structure is followed.
func (p *Patch) Apply(dst, body []byte) ([]byte, error) {
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return dst, ErrBadJSON
	}
	dst = append(dst, body[:i]...)
	dst, end, err := p.applyObject(dst, body, i, nil)
	if err != nil {
		return dst, err
	}
	return append(dst, body[end:]...), nil
}

// topHooks carries the extra top-level work of RewriteRequest so that the
// model swap, the patch and the reasoning backfill share one pass over the
// body.
type topHooks struct {
	model    []byte // encoded replacement for "model"; nil = leave
	backfill *RequestEdit
}

// edit is one replacement of a value span during applyObject.
type edit struct {
	vs, ve int
	op     int // index into ops, or editModel / editMessages
}

const (
	editModel    = -1
	editMessages = -2
)

// applyObject appends the object starting at b[start] (a '{') with p's
// operations applied, plus the hooks when h != nil. It returns the index just
// past the object's closing brace, or an error when the structure is broken.
func (p *Patch) applyObject(dst, b []byte, start int, h *topHooks) ([]byte, int, error) {
	var ops []patchOp
	if p != nil {
		ops = p.ops
	}
	nslots := len(ops) + 2
	// Last occurrence of each operation's key in the body (duplicate keys: the
	// last one is what encoding/json and most parsers use, so that is the one
	// changed; earlier duplicates are copied untouched).
	var slotBuf [16]edit
	var slots []edit
	if nslots <= len(slotBuf) {
		slots = slotBuf[:nslots]
	} else {
		slots = make([]edit, nslots)
	}
	for i := range slots {
		slots[i] = edit{vs: -1}
	}
	it := jsonscan.IterObject(b, start, false)
	var m jsonscan.Member
	lastEnd := start + 1 // where new members are inserted
	empty := true
	var tmp [64]byte
	for it.Next(&m) {
		empty = false
		lastEnd = m.Ve
		key := b[m.Ks:m.Ke]
		if m.Kesc {
			key = jsonscan.AppendUnescape(tmp[:0], key)
		}
		for i := range ops {
			if string(key) == ops[i].key {
				slots[i] = edit{vs: m.Vs, ve: m.Ve, op: i}
				break
			}
		}
		if h != nil {
			if h.model != nil && string(key) == "model" {
				slots[len(ops)] = edit{vs: m.Vs, ve: m.Ve, op: editModel}
			} else if h.backfill != nil && string(key) == "messages" {
				slots[len(ops)+1] = edit{vs: m.Vs, ve: m.Ve, op: editMessages}
			}
		}
	}
	if !it.OK() {
		return dst, 0, ErrBadJSON
	}
	// Order the edits by position (insertion sort: there are only a few). The
	// model/messages hooks never name a key p has an operation for, because
	// RewriteRequest only sets them for keys p doesn't touch.
	var editBuf [16]edit
	edits := editBuf[:0]
	for _, e := range slots {
		if e.vs < 0 {
			continue
		}
		edits = append(edits, e)
		for j := len(edits) - 1; j > 0 && edits[j-1].vs > edits[j].vs; j-- {
			edits[j-1], edits[j] = edits[j], edits[j-1]
		}
	}
	cur := start
	for _, e := range edits {
		dst = append(dst, b[cur:e.vs]...)
		switch e.op {
		case editModel:
			dst = append(dst, h.model...)
		case editMessages:
			dst = backfillMessages(dst, b[e.vs:e.ve], h.backfill)
		default:
			op := &ops[e.op]
			switch {
			case op.sub == nil:
				dst = append(dst, op.set...)
			case b[e.vs] == '{':
				var err error
				if dst, _, err = op.sub.applyObject(dst, b, e.vs, nil); err != nil {
					return dst, 0, err
				}
			default:
				dst = append(dst, op.mat...)
			}
		}
		cur = e.ve
	}
	// New keys go right after the last member (or the opening brace), so a
	// pretty-printed body keeps its closing brace on its own line.
	dst = append(dst, b[cur:lastEnd]...)
	for i := range ops {
		if slots[i].vs >= 0 {
			continue
		}
		if !empty {
			dst = append(dst, ',')
		}
		empty = false
		dst = append(dst, ops[i].rawKey...)
		dst = append(dst, ':')
		if ops[i].sub == nil {
			dst = append(dst, ops[i].set...)
		} else {
			dst = append(dst, ops[i].mat...)
		}
	}
	if h != nil && h.model != nil && slots[len(ops)].vs < 0 {
		if !empty {
			dst = append(dst, ',')
		}
		dst = append(dst, `"model":`...)
		dst = append(dst, h.model...)
	}
	return append(dst, b[lastEnd:it.Pos()]...), it.Pos(), nil
}
