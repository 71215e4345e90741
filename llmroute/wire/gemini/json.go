package gemini

import (
	"bytes"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// The JSON scanner lives in llmroute/internal/jsonscan; this file keeps the
// appenders that only Gemini answers need.
//
// U+2028 and U+2029 are valid raw inside a JSON string, but the Node genai
// SDK (Gemini CLI) cuts its SSE events with a regular expression whose "."
// stops at them, so every string this package writes towards the client
// carries them escaped.

var lsep = []byte("\xe2\x80") // first two bytes of U+2028 and U+2029

// appendJSONText appends a raw JSON value (a string with its quotes, an
// object, anything valid) with raw U+2028/U+2029 escaped; escapes already in
// it are kept as they are.
func appendJSONText(dst, v []byte) []byte {
	for {
		k := bytes.Index(v, lsep)
		if k < 0 || k+2 >= len(v) {
			return append(dst, v...)
		}
		if c := v[k+2]; c == 0xa8 || c == 0xa9 {
			dst = append(dst, v[:k]...)
			dst = append(dst, `\u202`...)
			dst = append(dst, '8'+c-0xa8)
			v = v[k+3:]
			continue
		}
		dst = append(dst, v[:k+2]...)
		v = v[k+2:]
	}
}

// appendQuotedText appends s as a JSON string for the client (escaped as
// jsonscan.AppendQuoted does, and U+2028/U+2029 escaped too).
func appendQuotedText[S ~string | ~[]byte](dst []byte, s S) []byte {
	mark := len(dst)
	dst = jsonscan.AppendQuoted(dst, s)
	if bytes.Contains(dst[mark:], lsep) {
		var tmp []byte
		tmp = append(tmp, dst[mark:]...)
		dst = appendJSONText(dst[:mark], tmp)
	}
	return dst
}

// appendCompact appends the valid JSON value v without white space outside
// strings (an SSE data line must not break) and with U+2028/U+2029 escaped.
func appendCompact(dst, v []byte) []byte {
	for i := 0; i < len(v); {
		c := v[i]
		switch c {
		case ' ', '\t', '\r', '\n':
			i++
		case '"':
			end, _, ok := jsonscan.ScanString(v, i, false)
			if !ok {
				return append(dst, v[i:]...)
			}
			dst = appendJSONText(dst, v[i:end])
			i = end
		default:
			j := i + 1
			for j < len(v) && v[j] != '"' && v[j] != ' ' && v[j] != '\t' && v[j] != '\r' && v[j] != '\n' {
				j++
			}
			dst = append(dst, v[i:j]...)
			i = j
		}
	}
	return dst
}

// isObject reports whether v (after white space) is a valid JSON object.
func isObject(v []byte) bool {
	i := jsonscan.SkipWS(v, 0)
	return i < len(v) && v[i] == '{' && jsonscan.Valid(v)
}

func nonEmptyString(v []byte) bool { return len(v) > 2 && v[0] == '"' }

// intOf parses a JSON number as a non-negative integer (fractions dropped);
// anything else is 0.
func intOf(v []byte) int64 {
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		if n > (1<<62)/10 {
			return n
		}
		n = n*10 + int64(c-'0')
	}
	return n
}
