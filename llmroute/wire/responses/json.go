package responses

import (
	"bytes"
	"unicode/utf8"
)

// A small allocation-free JSON walker for the streaming path, in the manner
// of llmroute/transform/json.go (whose helpers are unexported). Input is
// checked with json.Valid first; the walker then only finds value boundaries
// and never reads out of bounds even when that check was skipped.

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

// scanString returns the index just past the closing quote of the string
// whose opening quote is at b[i].
func scanString(b []byte, i int) (int, bool) {
	i++
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false
		}
		q += i
		// Count the backslashes right before the quote: an odd number
		// escapes it.
		n := 0
		for k := q - 1; k >= i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		i = q + 1
	}
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int, depth int) (int, bool) {
	if i >= len(b) || depth > 10000 {
		return 0, false
	}
	switch c := b[i]; c {
	case '"':
		return scanString(b, i)
	case '{', '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == closer {
			return i + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return 0, false
				}
				if i, ok = scanString(b, i); !ok {
					return 0, false
				}
				i = skipWS(b, i)
				if i >= len(b) || b[i] != ':' {
					return 0, false
				}
				i = skipWS(b, i+1)
			}
			if i, ok = skipValue(b, i, depth+1); !ok {
				return 0, false
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			if b[i] == closer {
				return i + 1, true
			}
			if b[i] != ',' {
				return 0, false
			}
			i = skipWS(b, i+1)
		}
	default:
		j := i
		for j < len(b) && (b[j] >= 'a' && b[j] <= 'z' || b[j] >= '0' && b[j] <= '9' ||
			b[j] == '-' || b[j] == '+' || b[j] == '.' || b[j] == 'E') {
			j++
		}
		return j, j > i
	}
}

// eachMember calls fn for every member of the object at b[start] with the
// raw key (no quotes) and the value's span. It reports false on malformed
// input or when fn returns false.
func eachMember(b []byte, start int, fn func(key []byte, vs, ve int) bool) bool {
	i := skipWS(b, start)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		ke, ok := scanString(b, i)
		if !ok {
			return false
		}
		key := b[i+1 : ke-1]
		i = skipWS(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		vs := skipWS(b, i+1)
		ve, ok := skipValue(b, vs, 1)
		if !ok || !fn(key, vs, ve) {
			return false
		}
		i = skipWS(b, ve)
		if i >= len(b) {
			return false
		}
		if b[i] == '}' {
			return true
		}
		if b[i] != ',' {
			return false
		}
		i = skipWS(b, i+1)
	}
}

// eachElem calls fn for every element span of the array at b[start].
func eachElem(b []byte, start int, fn func(vs, ve int) bool) bool {
	i := skipWS(b, start)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return true
	}
	for {
		ve, ok := skipValue(b, i, 1)
		if !ok || !fn(i, ve) {
			return false
		}
		i = skipWS(b, ve)
		if i >= len(b) {
			return false
		}
		if b[i] == ']' {
			return true
		}
		if b[i] != ',' {
			return false
		}
		i = skipWS(b, i+1)
	}
}

// isString reports whether v is a JSON string literal.
func isString(v []byte) bool { return len(v) >= 2 && v[0] == '"' }

// appendStringValue appends the decoded value of the JSON string literal v.
func appendStringValue(dst, v []byte) []byte {
	if !isString(v) {
		return dst
	}
	return appendUnescape(dst, v[1:len(v)-1])
}

// parseUint reads a non-negative JSON integer; anything else is 0.
func parseUint(v []byte) int64 {
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

// appendUnescape appends the decoded form of a JSON string interior. Lone
// surrogates become U+FFFD as in encoding/json.
func appendUnescape(dst, raw []byte) []byte {
	for {
		k := bytes.IndexByte(raw, '\\')
		if k < 0 {
			return append(dst, raw...)
		}
		dst = append(dst, raw[:k]...)
		raw = raw[k:]
		if len(raw) < 2 {
			return dst
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
		default:
			dst = append(dst, c)
		}
		raw = raw[2:]
	}
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

const hexDigits = "0123456789abcdef"

// appendEscaped appends s JSON-escaped without quotes. Invalid UTF-8 becomes
// U+FFFD so the output is always valid JSON; no HTML escaping.
func appendEscaped[S ~string | ~[]byte](dst []byte, s S) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
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
		var rb [utf8.UTFMax]byte
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

// appendQuoted appends s as a JSON string literal.
func appendQuoted[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst = appendEscaped(dst, s)
	return append(dst, '"')
}
