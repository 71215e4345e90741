package caddyfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// patch parses the rest of a `patch` setting, raw JSON or a block, into the
// bytes of a JSON object whose keys are in the order written.
func (p *parser) patch(where string) (json.RawMessage, error) {
	d := p.d
	where += "patch"
	if d.NextArg() {
		raw := d.Val()
		if d.NextArg() {
			return nil, d.Errf("%s: want one raw JSON object or a block, got more arguments", where)
		}
		if p.blockFollows() {
			return nil, d.Errf("%s: want raw JSON or a block, not both", where)
		}
		trimmed := strings.TrimSpace(raw)
		if trimmed == "" || trimmed[0] != '{' {
			return nil, d.Errf("%s: must be a JSON object", where)
		}
		var buf bytes.Buffer
		if err := appendRawJSON(&buf, trimmed); err != nil {
			return nil, d.Errf("%s: %v", where, err)
		}
		return buf.Bytes(), nil
	}
	if !p.blockFollows() {
		return nil, d.Errf("%s: want a block or one raw JSON object", where)
	}
	var buf bytes.Buffer
	if err := p.object(&buf, where); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// object parses the block that opens on the current line into a JSON object.
func (p *parser) object(buf *bytes.Buffer, path string) error {
	d := p.d
	if err := p.enter(path); err != nil {
		return err
	}
	defer p.leave()
	keys := map[string]int{}
	buf.WriteByte('{')
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		if !d.Token().Quoted() && (key == "[" || key == "]" || key == "{" || key == "}") {
			return d.Errf("%s: unexpected %q where a key was expected", path, key)
		}
		if line, dup := keys[key]; dup {
			return d.Errf("%s: duplicate key %q (first at line %d)", path, key, line)
		}
		keys[key] = d.Line()
		if len(keys) > 1 {
			buf.WriteByte(',')
		}
		appendString(buf, key)
		buf.WriteByte(':')
		if err := p.value(buf, path+"."+key); err != nil {
			return err
		}
	}
	buf.WriteByte('}')
	return nil
}

// value parses what follows a key: one item, several items (an array), or a
// nested block.
func (p *parser) value(buf *bytes.Buffer, path string) error {
	d := p.d
	var items [][]byte
	for d.NextArg() {
		item, err := p.item(path)
		if err != nil {
			return err
		}
		items = append(items, item)
	}
	if p.blockFollows() {
		if len(items) > 0 {
			return d.Errf("%s: want values or a block, not both", path)
		}
		return p.object(buf, path)
	}
	switch len(items) {
	case 0:
		return d.Errf("%s: missing value", path)
	case 1:
		buf.Write(items[0])
	default:
		appendArray(buf, items)
	}
	return nil
}

// item parses the value at the cursor: `[` opens an array, a backtick or
// heredoc token is raw JSON, a double-quoted token is a string, and a bare
// word is a JSON literal if it parses as one, else a string.
func (p *parser) item(path string) ([]byte, error) {
	d := p.d
	text := d.Val()
	var buf bytes.Buffer
	switch quoteOf(d) {
	case '`', '<':
		if err := appendRawJSON(&buf, text); err != nil {
			return nil, d.Errf("%s: raw JSON: %v", path, err)
		}
		return buf.Bytes(), nil
	case '"':
		appendString(&buf, text)
		return buf.Bytes(), nil
	}
	switch text {
	case "[":
		return p.array(path)
	case "]", "{", "}":
		return nil, d.Errf("%s: unexpected %q", path, text)
	}
	if isJSONLiteral(text) {
		if err := appendRawJSON(&buf, text); err != nil {
			return nil, d.Errf("%s: %v", path, err)
		}
		return buf.Bytes(), nil
	}
	appendString(&buf, text)
	return buf.Bytes(), nil
}

// array parses the items after a `[` up to the matching `]`, across lines.
func (p *parser) array(path string) ([]byte, error) {
	d := p.d
	if err := p.enter(path); err != nil {
		return nil, err
	}
	defer p.leave()
	openLine := d.Line()
	var items [][]byte
	for {
		if !d.Next() {
			return nil, d.Errf("%s: '[' at line %d is not closed", path, openLine)
		}
		if !d.Token().Quoted() {
			switch d.Val() {
			case "]":
				var buf bytes.Buffer
				appendArray(&buf, items)
				return buf.Bytes(), nil
			case "{", "}":
				return nil, d.Errf("%s: unexpected %q inside the '[' of line %d (write arrays of objects as raw JSON in backticks)", path, d.Val(), openLine)
			}
		}
		item, err := p.item(path)
		if err != nil {
			return nil, err
		}
		items = append(items, item)
	}
}

// maxPatchDepth bounds the nesting of blocks and arrays in a patch.
const maxPatchDepth = 64

// enter counts one more level of patch nesting and rejects too deep a patch.
func (p *parser) enter(path string) error {
	p.depth++
	if p.depth > maxPatchDepth {
		return p.d.Errf("%s: nested more than %d levels deep", path, maxPatchDepth)
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

// quoteOf tells how the token at the cursor was quoted: 0 (bare), '"', '`'
// or '<' (heredoc).
func quoteOf(d *caddyfile.Dispenser) rune {
	if !d.Token().Quoted() {
		return 0
	}
	// ValRaw adds the quotes back, except around a heredoc.
	if raw := d.ValRaw(); raw != d.Val() && (raw[0] == '"' || raw[0] == '`') {
		return rune(raw[0])
	}
	return '<'
}

// isJSONLiteral reports whether a bare word is a JSON value: a number, true,
// false, null, or a JSON string, array or object written without spaces.
func isJSONLiteral(s string) bool {
	switch s {
	case "true", "false", "null":
		return true
	case "":
		return false
	}
	switch c := s[0]; {
	case c == '-' || c >= '0' && c <= '9', c == '"', c == '[', c == '{':
		return json.Valid([]byte(s))
	}
	return false
}

func appendString(buf *bytes.Buffer, s string) {
	b, _ := json.Marshal(s) // a string always marshals
	buf.Write(b)
}

func appendArray(buf *bytes.Buffer, items [][]byte) {
	buf.WriteByte('[')
	for i, item := range items {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(item)
	}
	buf.WriteByte(']')
}

// appendRawJSON checks one JSON value and appends it compacted, keeping its
// key order.
func appendRawJSON(buf *bytes.Buffer, s string) error {
	if err := checkJSON([]byte(s)); err != nil {
		return err
	}
	return json.Compact(buf, []byte(s))
}

// checkJSON accepts exactly one JSON value whose objects have no repeated
// key and whose numbers survive Caddy's float64 round trip of the config.
func checkJSON(data []byte) error {
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		if err == nil {
			err = errors.New("invalid JSON")
		}
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.keys != nil && top.wantKey {
			if tok == json.Delim('}') {
				stack = stack[:len(stack)-1]
				valueDone(stack)
				continue
			}
			key, _ := tok.(string)
			if top.keys[key] {
				return fmt.Errorf("duplicate key %q", key)
			}
			top.keys[key] = true
			top.wantKey = false
			continue
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, &frame{keys: map[string]bool{}, wantKey: true})
			case '[':
				stack = append(stack, &frame{})
			default: // ']'
				stack = stack[:len(stack)-1]
				valueDone(stack)
			}
		case json.Number:
			if err := checkNumber(string(v)); err != nil {
				return err
			}
			valueDone(stack)
		default:
			valueDone(stack)
		}
	}
}

// frame is an open object or array in checkJSON.
type frame struct {
	keys    map[string]bool // nil for an array
	wantKey bool
}

// valueDone marks that the innermost object, if that is what encloses the
// value just read, now wants its next key.
func valueDone(stack []*frame) {
	if len(stack) > 0 && stack[len(stack)-1].keys != nil {
		stack[len(stack)-1].wantKey = true
	}
}

// maxExactInt is the largest integer magnitude a float64 holds exactly.
const maxExactInt = 1 << 53

// checkNumber rejects numbers that Caddy's float64 round trip of the config
// would break: out of range, or integers it would round.
func checkNumber(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) {
		return fmt.Errorf("number %s is out of range", s)
	}
	if strings.ContainsAny(s, ".eE") {
		return nil // a fraction: rounding to float64 is what the writer expects
	}
	if n, err := strconv.ParseInt(s, 10, 64); err != nil || n > maxExactInt || n < -maxExactInt {
		return fmt.Errorf("integer %s is too large: Caddy keeps config numbers as float64, exact only up to 2^53 (write it as a string if the API accepts one)", s)
	}
	return nil
}
