package anthropic

import (
	"bytes"
	"unicode/utf8"
)

// This file holds a small allocation-free JSON scanner over raw bytes. The rest
// of the package never unmarshals a whole body: it walks the bytes, records the
// spans it cares about and copies everything else verbatim, so key order,
// whitespace and number formatting survive untouched.
//
// Two modes exist. strict validates exactly what encoding/json's json.Valid
// accepts (grammar, escapes, control characters, nesting depth 10000; invalid
// UTF-8 is accepted, as json.Valid does). fast trusts that the input was already
// validated and only finds value boundaries, using memchr-speed searches for
// string ends; on malformed input it still never reads out of bounds and
// reports failure when the structure cannot be followed.

// maxDepth mirrors encoding/json's nesting limit so strict mode agrees with
// json.Valid, and bounds recursion on hostile input in both modes.
const maxDepth = 10000

// strPlain[c] is true for bytes that may appear unescaped inside a JSON string
// and need no attention from the strict scanner.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// hexVal maps a hex digit to its value and anything else to 0xff.
var hexVal = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
		t[c-'a'+'A'] = byte(c - 'a' + 10)
	}
	return t
}()

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\n', '\r', '\t':
			i++
		default:
			return i
		}
	}
	return i
}

// scanString returns the index just past the closing quote of the string whose
// opening quote is at b[i], and whether the string contains escapes (so its raw
// bytes differ from its decoded value).
func scanString(b []byte, i int, strict bool) (end int, esc bool, ok bool) {
	if strict {
		return scanStringStrict(b, i)
	}
	return scanStringFast(b, i)
}

func scanStringStrict(b []byte, i int) (int, bool, bool) {
	i++
	esc := false
	for {
		// Eight bytes at a time while none of them is special: this is the
		// hot loop when validating long message contents.
		for i+8 <= len(b) {
			if !strPlain[b[i]] || !strPlain[b[i+1]] || !strPlain[b[i+2]] || !strPlain[b[i+3]] ||
				!strPlain[b[i+4]] || !strPlain[b[i+5]] || !strPlain[b[i+6]] || !strPlain[b[i+7]] {
				break
			}
			i += 8
		}
		for i < len(b) && strPlain[b[i]] {
			i++
		}
		if i >= len(b) {
			return 0, false, false
		}
		switch b[i] {
		case '"':
			return i + 1, esc, true
		case '\\':
			esc = true
			if i+1 >= len(b) {
				return 0, false, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hexVal[b[i+2]]|hexVal[b[i+3]]|hexVal[b[i+4]]|hexVal[b[i+5]] == 0xff {
					return 0, false, false
				}
				i += 6
			default:
				return 0, false, false
			}
		default: // control character
			return 0, false, false
		}
	}
}

func scanStringFast(b []byte, i int) (int, bool, bool) {
	i++
	// Most keys and values are short: scanning them inline beats the call
	// overhead of memchr. Long strings (message contents) go to IndexByte.
	for lim := min(i+32, len(b)); i < lim; i++ {
		if c := b[i]; c == '"' {
			return i + 1, false, true
		} else if c == '\\' {
			break
		}
	}
	esc := false
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false, false
		}
		q += i
		// Walk the backslashes before the candidate quote; each escapes the
		// byte after it. If the last one escapes the quote itself, keep going.
		// Every byte is looked at a bounded number of times, so strings full of
		// escapes stay linear.
		for {
			k := bytes.IndexByte(b[i:q], '\\')
			if k < 0 {
				break
			}
			esc = true
			i += k + 2
			if i > q {
				break
			}
		}
		if i <= q {
			return q + 1, esc, true
		}
		// The quote at q was escaped; i == q+1.
	}
}

// skipValue returns the index just past the JSON value starting at b[i] (no
// leading whitespace).
func skipValue(b []byte, i int, strict bool, depth int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; c {
	case '"':
		end, _, ok := scanString(b, i, strict)
		return end, ok
	case '{':
		if depth >= maxDepth {
			return 0, false
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return 0, false
			}
			end, _, ok := scanString(b, i, strict)
			if !ok {
				return 0, false
			}
			i = skipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return 0, false
			}
			i = skipWS(b, i+1)
			if i, ok = skipValue(b, i, strict, depth+1); !ok {
				return 0, false
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			if b[i] == '}' {
				return i + 1, true
			}
			if b[i] != ',' {
				return 0, false
			}
			i = skipWS(b, i+1)
		}
	case '[':
		if depth >= maxDepth {
			return 0, false
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = skipValue(b, i, strict, depth+1); !ok {
				return 0, false
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			if b[i] == ']' {
				return i + 1, true
			}
			if b[i] != ',' {
				return 0, false
			}
			i = skipWS(b, i+1)
		}
	case 't':
		return skipLit(b, i, "true")
	case 'f':
		return skipLit(b, i, "false")
	case 'n':
		return skipLit(b, i, "null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			if strict {
				return skipNumberStrict(b, i)
			}
			j := i + 1
			for j < len(b) && (b[j] >= '0' && b[j] <= '9' || b[j] == '.' || b[j] == 'e' || b[j] == 'E' || b[j] == '+' || b[j] == '-') {
				j++
			}
			return j, true
		}
		return 0, false
	}
}

func skipLit(b []byte, i int, lit string) (int, bool) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), true
	}
	return 0, false
}

// skipNumberStrict follows the JSON number grammar exactly:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func skipNumberStrict(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return 0, false
	}
	switch {
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// validJSON reports whether b is exactly one JSON value with optional
// surrounding whitespace; it agrees with encoding/json's json.Valid.
func validJSON(b []byte) bool {
	i := skipWS(b, 0)
	end, ok := skipValue(b, i, true, 0)
	return ok && skipWS(b, end) == len(b)
}

// member is one "key": value pair of an object, as spans into the buffer.
// The key span excludes the quotes; the value span is the raw value.
type member struct {
	ks, ke int  // key interior
	kesc   bool // key contains escapes: compare decoded
	vs, ve int  // value
}

// objIter walks the members of one object without allocating.
type objIter struct {
	b      []byte
	i      int
	strict bool
	depth  int
	first  bool
	ok     bool // false once malformed input was seen
	close  int  // index of the closing '}' once next returned false with ok
}

// iterObject starts iterating the object whose '{' is at b[start].
func iterObject(b []byte, start int, strict bool) objIter {
	it := objIter{b: b, i: start + 1, strict: strict, first: true, ok: start < len(b) && b[start] == '{'}
	return it
}

// next fills m with the next member. It returns false at the end of the object
// or on malformed input; check it.ok to tell them apart.
func (it *objIter) next(m *member) bool {
	if !it.ok {
		return false
	}
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.ok = false
		return false
	}
	if it.first {
		it.first = false
		if b[i] == '}' {
			it.close = i
			it.i = i + 1
			return false
		}
	} else {
		switch b[i] {
		case '}':
			it.close = i
			it.i = i + 1
			return false
		case ',':
			i = skipWS(b, i+1)
		default:
			it.ok = false
			return false
		}
	}
	if i >= len(b) || b[i] != '"' {
		it.ok = false
		return false
	}
	end, esc, ok := scanString(b, i, it.strict)
	if !ok {
		it.ok = false
		return false
	}
	m.ks, m.ke, m.kesc = i+1, end-1, esc
	i = skipWS(b, end)
	if i >= len(b) || b[i] != ':' {
		it.ok = false
		return false
	}
	i = skipWS(b, i+1)
	m.vs = i
	if i, ok = skipValue(b, i, it.strict, it.depth+1); !ok {
		it.ok = false
		return false
	}
	m.ve = i
	it.i = i
	return true
}

// arrIter walks the elements of one array without allocating.
type arrIter struct {
	b      []byte
	i      int
	strict bool
	first  bool
	ok     bool
}

func iterArray(b []byte, start int, strict bool) arrIter {
	return arrIter{b: b, i: start + 1, strict: strict, first: true, ok: start < len(b) && b[start] == '['}
}

// next returns the span of the next element; false at the end or on malformed
// input (then it.ok is false).
func (it *arrIter) next() (vs, ve int, more bool) {
	if !it.ok {
		return 0, 0, false
	}
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.ok = false
		return 0, 0, false
	}
	if it.first {
		it.first = false
		if b[i] == ']' {
			it.i = i + 1
			return 0, 0, false
		}
	} else {
		switch b[i] {
		case ']':
			it.i = i + 1
			return 0, 0, false
		case ',':
			i = skipWS(b, i+1)
		default:
			it.ok = false
			return 0, 0, false
		}
	}
	end, ok := skipValue(b, i, it.strict, 1)
	if !ok {
		it.ok = false
		return 0, 0, false
	}
	it.i = end
	return i, end, true
}

// keyIs reports whether the member's decoded key equals want.
func keyIs(b []byte, m *member, want string) bool {
	raw := b[m.ks:m.ke]
	if !m.kesc {
		return string(raw) == want
	}
	if len(raw) < len(want) { // decoding only ever shrinks
		return false
	}
	var tmp [64]byte
	return string(appendUnescape(tmp[:0], raw)) == want
}

// strIs reports whether the raw JSON string value v decodes to want.
func strIs(v []byte, esc bool, want string) bool {
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	raw := v[1 : len(v)-1]
	if !esc && bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == want
	}
	var tmp [64]byte
	return string(appendUnescape(tmp[:0], raw)) == want
}

// appendUnescape appends the decoded form of a JSON string interior (no
// quotes). Lone or malformed surrogate escapes become U+FFFD as in
// encoding/json; raw bytes are copied as they are.
func appendUnescape(dst, raw []byte) []byte {
	for {
		k := bytes.IndexByte(raw, '\\')
		if k < 0 {
			return append(dst, raw...)
		}
		dst = append(dst, raw[:k]...)
		raw = raw[k:]
		if len(raw) < 2 {
			return dst // malformed; strict scanning never lets this through
		}
		switch c := raw[1]; c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(raw[2:])
			if !ok {
				return dst
			}
			raw = raw[6:]
			if r >= 0xd800 && r < 0xdc00 {
				// High surrogate: needs a low one right after it.
				if len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
					if r2, ok := hex4(raw[2:]); ok && r2 >= 0xdc00 && r2 < 0xe000 {
						dst = utf8.AppendRune(dst, (r-0xd800)<<10|(r2-0xdc00)+0x10000)
						raw = raw[6:]
						continue
					}
				}
				r = utf8.RuneError
			} else if r >= 0xdc00 && r < 0xe000 {
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
		raw = raw[2:]
	}
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	a, c, d, e := hexVal[b[0]], hexVal[b[1]], hexVal[b[2]], hexVal[b[3]]
	if a|c|d|e == 0xff {
		return 0, false
	}
	return rune(a)<<12 | rune(c)<<8 | rune(d)<<4 | rune(e), true
}

// strEsc[c] is true for ASCII bytes that must be escaped in a JSON string.
var strEsc = func() (t [128]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'] = true
	t['\\'] = true
	return t
}()

const hexDigits = "0123456789abcdef"

// appendQuoted appends s as a JSON string literal. No HTML escaping is done;
// invalid UTF-8 becomes U+FFFD so the output is always valid UTF-8 and JSON.
func appendQuoted(dst, s []byte) []byte {
	dst = append(dst, '"')
	dst = appendEscaped(dst, s)
	return append(dst, '"')
}

// appendEscaped appends the JSON-escaped form of s (a string or bytes)
// without quotes. Invalid UTF-8 becomes U+FFFD, as encoding/json does.
func appendEscaped[S ~string | ~[]byte](dst []byte, s S) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if !strEsc[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		var rb [utf8.UTFMax]byte // decode without converting s
		r, size := utf8.DecodeRune(rb[:copy(rb[:], s[i:])])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	return append(dst, s[start:]...)
}

// appendQuotedString is appendQuoted for a string without converting it.
func appendQuotedString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendEscaped(dst, s)
	return append(dst, '"')
}

// keyOf returns the decoded key of m, using tmp for escaped keys.
func keyOf(b []byte, m *member, tmp []byte) []byte {
	raw := b[m.ks:m.ke]
	if !m.kesc {
		return raw
	}
	return appendUnescape(tmp[:0], raw)
}

// objSpan returns the span of the value of key in the object obj (which
// starts at obj[0]); vs is -1 when the key is absent. When a key repeats, the
// last occurrence wins, as in encoding/json.
func objSpan(obj []byte, key string) (vs, ve int) {
	vs = -1
	it := iterObject(obj, 0, false)
	var m member
	for it.next(&m) {
		if keyIs(obj, &m, key) {
			vs, ve = m.vs, m.ve
		}
	}
	return vs, ve
}

// objGet returns the raw value of key in the object obj, or nil.
func objGet(obj []byte, key string) []byte {
	if len(obj) == 0 || obj[0] != '{' {
		return nil
	}
	vs, ve := objSpan(obj, key)
	if vs < 0 {
		return nil
	}
	return obj[vs:ve]
}

// blockTypeText returns the raw "type" and "text" values of a content block
// (nil when absent); text is nil unless it is a string.
func blockTypeText(blk []byte) (typ, text []byte) {
	if len(blk) == 0 || blk[0] != '{' {
		return nil, nil
	}
	it := iterObject(blk, 0, false)
	var m member
	for it.next(&m) {
		switch {
		case keyIs(blk, &m, "type"):
			typ = blk[m.vs:m.ve]
		case keyIs(blk, &m, "text"):
			text = blk[m.vs:m.ve]
		}
	}
	if text != nil && text[0] != '"' {
		text = nil
	}
	return typ, text
}

// numberOrNil returns v when it is a JSON number, else nil.
func numberOrNil(v []byte) []byte {
	if len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
		return v
	}
	return nil
}

func isEmptyArray(v []byte) bool {
	return len(v) > 0 && v[0] == '[' && skipWS(v, 1) < len(v) && v[skipWS(v, 1)] == ']'
}
