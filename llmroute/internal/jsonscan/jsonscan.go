// Package jsonscan is a small allocation-free JSON scanner over raw bytes,
// shared by llmroute/transform and the wire translators. Its users never
// unmarshal a whole body: they walk the bytes, record the spans they care
// about and copy everything else verbatim, so key order, whitespace and
// number formatting survive untouched. It imports only the standard library.
package jsonscan

import (
	"bytes"
	"unicode/utf8"
)

// Two modes exist. strict validates exactly what encoding/json's json.Valid
// accepts (grammar, escapes, control characters, nesting depth 10000; invalid
// UTF-8 is accepted, as json.Valid does). fast trusts that the input was already
// validated and only finds value boundaries, using memchr-speed searches for
// string ends; on malformed input it still never reads out of bounds and
// reports failure when the structure cannot be followed.

// MaxDepth mirrors encoding/json's nesting limit so strict mode agrees with
// json.Valid, and bounds recursion on hostile input in both modes.
const MaxDepth = 10000

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

// SkipWS returns the index of the first non-whitespace byte at or after b[i].
func SkipWS(b []byte, i int) int {
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

// ScanString returns the index just past the closing quote of the string whose
// opening quote is at b[i], and whether the string contains escapes (so its raw
// bytes differ from its decoded value).
func ScanString(b []byte, i int, strict bool) (end int, esc bool, ok bool) {
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

// SkipValue returns the index just past the JSON value starting at b[i] (no
// leading whitespace).
func SkipValue(b []byte, i int, strict bool, depth int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; c {
	case '"':
		end, _, ok := ScanString(b, i, strict)
		return end, ok
	case '{':
		if depth >= MaxDepth {
			return 0, false
		}
		i = SkipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return 0, false
			}
			end, _, ok := ScanString(b, i, strict)
			if !ok {
				return 0, false
			}
			i = SkipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return 0, false
			}
			i = SkipWS(b, i+1)
			if i, ok = SkipValue(b, i, strict, depth+1); !ok {
				return 0, false
			}
			i = SkipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			if b[i] == '}' {
				return i + 1, true
			}
			if b[i] != ',' {
				return 0, false
			}
			i = SkipWS(b, i+1)
		}
	case '[':
		if depth >= MaxDepth {
			return 0, false
		}
		i = SkipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = SkipValue(b, i, strict, depth+1); !ok {
				return 0, false
			}
			i = SkipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			if b[i] == ']' {
				return i + 1, true
			}
			if b[i] != ',' {
				return 0, false
			}
			i = SkipWS(b, i+1)
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

// Valid reports whether b is exactly one JSON value with optional
// surrounding whitespace; it agrees with encoding/json's json.Valid.
func Valid(b []byte) bool {
	i := SkipWS(b, 0)
	end, ok := SkipValue(b, i, true, 0)
	return ok && SkipWS(b, end) == len(b)
}

// Member is one "key": value pair of an object, as spans into the buffer.
// The key span excludes the quotes; the value span is the raw value.
type Member struct {
	Ks, Ke int  // key interior
	Kesc   bool // key contains escapes: compare decoded
	Vs, Ve int  // value
}

// ObjIter walks the members of one object without allocating.
type ObjIter struct {
	b      []byte
	i      int
	strict bool
	depth  int
	first  bool
	ok     bool // false once malformed input was seen
}

// IterObject starts iterating the object whose '{' is at b[start].
func IterObject(b []byte, start int, strict bool) ObjIter {
	it := ObjIter{b: b, i: start + 1, strict: strict, first: true, ok: start < len(b) && b[start] == '{'}
	return it
}

// OK reports whether no malformed input was seen so far; after Next returned
// false it tells the end of the object from an error.
func (it *ObjIter) OK() bool { return it.ok }

// Pos is the index just past the last member read, or just past the closing
// '}' once Next returned false with OK.
func (it *ObjIter) Pos() int { return it.i }

// Next fills m with the next member. It returns false at the end of the object
// or on malformed input; check OK to tell them apart.
func (it *ObjIter) Next(m *Member) bool {
	if !it.ok {
		return false
	}
	b := it.b
	i := SkipWS(b, it.i)
	if i >= len(b) {
		it.ok = false
		return false
	}
	if it.first {
		it.first = false
		if b[i] == '}' {
			it.i = i + 1
			return false
		}
	} else {
		switch b[i] {
		case '}':
			it.i = i + 1
			return false
		case ',':
			i = SkipWS(b, i+1)
		default:
			it.ok = false
			return false
		}
	}
	if i >= len(b) || b[i] != '"' {
		it.ok = false
		return false
	}
	end, esc, ok := ScanString(b, i, it.strict)
	if !ok {
		it.ok = false
		return false
	}
	m.Ks, m.Ke, m.Kesc = i+1, end-1, esc
	i = SkipWS(b, end)
	if i >= len(b) || b[i] != ':' {
		it.ok = false
		return false
	}
	i = SkipWS(b, i+1)
	m.Vs = i
	if i, ok = SkipValue(b, i, it.strict, it.depth+1); !ok {
		it.ok = false
		return false
	}
	m.Ve = i
	it.i = i
	return true
}

// ArrIter walks the elements of one array without allocating.
type ArrIter struct {
	b      []byte
	i      int
	strict bool
	first  bool
	atElem bool // i is at an element, not after '[' (see ResumeArray)
	ok     bool
}

// IterArray starts iterating the array whose '[' is at b[start].
func IterArray(b []byte, start int, strict bool) ArrIter {
	return ArrIter{b: b, i: start + 1, strict: strict, first: true, ok: start < len(b) && b[start] == '['}
}

// ResumeArray iterates an array from its element starting at b[at] (a span
// an earlier walk returned), to resume a walk in the middle of an array.
func ResumeArray(b []byte, at int, strict bool) ArrIter {
	return ArrIter{b: b, i: at, strict: strict, first: true, atElem: true, ok: true}
}

// OK reports whether no malformed input was seen so far.
func (it *ArrIter) OK() bool { return it.ok }

// Next returns the span of the next element; false at the end or on malformed
// input (then OK is false).
func (it *ArrIter) Next() (vs, ve int, more bool) {
	if !it.ok {
		return 0, 0, false
	}
	b := it.b
	i := SkipWS(b, it.i)
	if it.first && it.atElem {
		it.first = false
		end, ok := SkipValue(b, i, it.strict, 1)
		if !ok {
			it.ok = false
			return 0, 0, false
		}
		it.i = end
		return i, end, true
	}
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
			i = SkipWS(b, i+1)
		default:
			it.ok = false
			return 0, 0, false
		}
	}
	end, ok := SkipValue(b, i, it.strict, 1)
	if !ok {
		it.ok = false
		return 0, 0, false
	}
	it.i = end
	return i, end, true
}

// KeyIs reports whether the member's decoded key equals want.
func KeyIs(b []byte, m *Member, want string) bool {
	raw := b[m.Ks:m.Ke]
	if !m.Kesc {
		return string(raw) == want
	}
	if len(raw) < len(want) { // decoding only ever shrinks
		return false
	}
	var tmp [64]byte
	return string(AppendUnescape(tmp[:0], raw)) == want
}

// StrIs reports whether the raw JSON string value v decodes to want.
func StrIs(v []byte, esc bool, want string) bool {
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	raw := v[1 : len(v)-1]
	if !esc && bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == want
	}
	var tmp [64]byte
	return string(AppendUnescape(tmp[:0], raw)) == want
}

// AppendUnescape appends the decoded form of a JSON string interior (no
// quotes). Lone or malformed surrogate escapes become U+FFFD as in
// encoding/json; raw bytes are copied as they are.
func AppendUnescape(dst, raw []byte) []byte {
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
			r, ok := Hex4(raw[2:])
			if !ok {
				return dst
			}
			raw = raw[6:]
			if r >= 0xd800 && r < 0xdc00 {
				// High surrogate: needs a low one right after it.
				if len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
					if r2, ok := Hex4(raw[2:]); ok && r2 >= 0xdc00 && r2 < 0xe000 {
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

// Hex4 decodes the four hex digits at the start of b (the XXXX of \uXXXX).
func Hex4(b []byte) (rune, bool) {
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

// AppendQuoted appends s (a string or bytes) as a JSON string literal. No
// HTML escaping is done; invalid UTF-8 becomes U+FFFD so the output is always
// valid UTF-8 and JSON.
func AppendQuoted[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst = AppendEscaped(dst, s)
	return append(dst, '"')
}

// AppendEscaped appends the JSON-escaped form of s (a string or bytes)
// without quotes. Invalid UTF-8 becomes U+FFFD, as encoding/json does.
func AppendEscaped[S ~string | ~[]byte](dst []byte, s S) []byte {
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

// TwoMembers finds the members named k1 and k2 of the object starting at
// b[start]; a member that is absent has Vs == -1. ok reports a well-formed
// object.
func TwoMembers(b []byte, start int, k1, k2 string) (m1, m2 Member, ok bool) {
	it := IterObject(b, start, false)
	var m Member
	m1.Vs, m2.Vs = -1, -1
	for it.Next(&m) {
		if KeyIs(b, &m, k1) {
			m1 = m
		} else if KeyIs(b, &m, k2) {
			m2 = m
		}
	}
	return m1, m2, it.ok
}

// KeyOf returns the decoded key of m, using tmp for escaped keys.
func KeyOf(b []byte, m *Member, tmp []byte) []byte {
	raw := b[m.Ks:m.Ke]
	if !m.Kesc {
		return raw
	}
	return AppendUnescape(tmp[:0], raw)
}

// ObjSpan returns the span of the value of key in the object obj (which
// starts at obj[0]); vs is -1 when the key is absent. When a key repeats, the
// last occurrence wins, as in encoding/json.
func ObjSpan(obj []byte, key string) (vs, ve int) {
	vs = -1
	it := IterObject(obj, 0, false)
	var m Member
	for it.Next(&m) {
		if KeyIs(obj, &m, key) {
			vs, ve = m.Vs, m.Ve
		}
	}
	return vs, ve
}

// ObjGet returns the raw value of key in the object obj, or nil.
func ObjGet(obj []byte, key string) []byte {
	if len(obj) == 0 || obj[0] != '{' {
		return nil
	}
	vs, ve := ObjSpan(obj, key)
	if vs < 0 {
		return nil
	}
	return obj[vs:ve]
}

// NumberOrNil returns v when it is a JSON number, else nil.
func NumberOrNil(v []byte) []byte {
	if len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
		return v
	}
	return nil
}

// IsEmptyArray reports whether v is a JSON array with no elements.
func IsEmptyArray(v []byte) bool {
	return len(v) > 0 && v[0] == '[' && SkipWS(v, 1) < len(v) && v[SkipWS(v, 1)] == ']'
}

// IsString reports whether v is a JSON string literal.
func IsString(v []byte) bool { return len(v) >= 2 && v[0] == '"' }

// AppendStringValue appends the decoded value of the JSON string literal v;
// anything else appends nothing.
func AppendStringValue(dst, v []byte) []byte {
	if !IsString(v) {
		return dst
	}
	return AppendUnescape(dst, v[1:len(v)-1])
}

// ParseUint reads a non-negative JSON integer (a fraction or exponent is cut
// off); anything else is 0. Values past 2^62 saturate.
func ParseUint(v []byte) int64 {
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			if c == '.' || c == 'e' || c == 'E' {
				break
			}
			return 0
		}
		if n > (1<<62)/10 {
			return n
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// EachMember calls fn for every member of the object at b[start] (leading
// white space allowed) with the raw key (no quotes, escapes not decoded) and
// the value's span, in fast mode. It reports false on malformed input or when
// fn returns false.
func EachMember(b []byte, start int, fn func(key []byte, vs, ve int) bool) bool {
	it := IterObject(b, SkipWS(b, start), false)
	var m Member
	for it.Next(&m) {
		if !fn(b[m.Ks:m.Ke], m.Vs, m.Ve) {
			return false
		}
	}
	return it.ok
}

// EachElem calls fn for every element span of the array at b[start] (leading
// white space allowed), in fast mode. It reports false on malformed input or
// when fn returns false.
func EachElem(b []byte, start int, fn func(vs, ve int) bool) bool {
	it := IterArray(b, SkipWS(b, start), false)
	for {
		vs, ve, more := it.Next()
		if !more {
			return it.ok
		}
		if !fn(vs, ve) {
			return false
		}
	}
}
