package anthropic

import (
	"strconv"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// imageTokens is what one image counts in CountTokensEstimate: about what
// Anthropic charges for an image near its size limit (≈ 1.15 megapixels / 750).
const imageTokens = 1600

// CountTokensEstimate is a local estimate of a Messages request's input
// tokens, for count_tokens when no native upstream can answer: the bytes of
// every string value under system, messages and tools (keys, JSON syntax and
// the billing block not counted), divided by 4 and rounded up, plus 1600 per
// image block (whose base64 data is not counted), plus 4 per message for
// role and framing. Invalid JSON counts 0. It errs on the high side for code
// and non-English text less than a byte count of the whole body would.
func CountTokensEstimate(body []byte) int {
	if !jsonscan.Valid(body) {
		return 0
	}
	i := jsonscan.SkipWS(body, 0)
	if body[i] != '{' {
		return 0
	}
	var c counter
	obj := body[i:]
	it := jsonscan.IterObject(obj, 0, false)
	var m jsonscan.Member
	for it.Next(&m) {
		v := obj[m.Vs:m.Ve]
		switch {
		case jsonscan.KeyIs(obj, &m, "system"):
			if v[0] == '[' {
				ai := jsonscan.IterArray(v, 0, false)
				first := true
				for {
					vs, ve, more := ai.Next()
					if !more {
						break
					}
					blk := v[vs:ve]
					if first {
						first = false
						if typ, text := blockTypeText(blk); jsonscan.StrIs(typ, true, "text") && text != nil && isBillingText(text) {
							continue
						}
					}
					c.walk(blk)
				}
			} else {
				c.walk(v)
			}
		case jsonscan.KeyIs(obj, &m, "messages"):
			if v[0] == '[' {
				ai := jsonscan.IterArray(v, 0, false)
				for {
					vs, ve, more := ai.Next()
					if !more {
						break
					}
					c.tokens += 4
					c.walk(v[vs:ve])
				}
			}
		case jsonscan.KeyIs(obj, &m, "tools"):
			c.walk(v)
		}
	}
	return c.tokens + (c.bytes+3)/4
}

type counter struct{ bytes, tokens int }

// walk counts the string values in v, images at a fixed price.
func (c *counter) walk(v []byte) {
	switch v[0] {
	case '"':
		c.bytes += len(v) - 2
	case '[':
		it := jsonscan.IterArray(v, 0, false)
		for {
			vs, ve, more := it.Next()
			if !more {
				return
			}
			c.walk(v[vs:ve])
		}
	case '{':
		if jsonscan.StrIs(jsonscan.ObjGet(v, "type"), true, "image") {
			c.tokens += imageTokens
			return
		}
		it := jsonscan.IterObject(v, 0, false)
		var m jsonscan.Member
		for it.Next(&m) {
			c.walk(v[m.Vs:m.Ve])
		}
	}
}

// CountTokensBody is the count_tokens answer for n input tokens.
func CountTokensBody(n int) []byte {
	b := append([]byte(nil), `{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '}')
}

// ModelsBody is GET /v1/models in Anthropic's list shape: data[] of
// {"type":"model","id","display_name","created_at"} (display_name is the id,
// created_at the given time in RFC 3339, UTC), has_more false, first_id and
// last_id (null for an empty list).
func ModelsBody(names []string, created time.Time) []byte {
	ts := created.UTC().Format(time.RFC3339)
	b := append([]byte(nil), `{"data":[`...)
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"type":"model","id":`...)
		b = jsonscan.AppendQuoted(b, n)
		b = append(b, `,"display_name":`...)
		b = jsonscan.AppendQuoted(b, n)
		b = append(b, `,"created_at":"`...)
		b = append(b, ts...)
		b = append(b, `"}`...)
	}
	b = append(b, `],"has_more":false,"first_id":`...)
	if len(names) == 0 {
		return append(b, `null,"last_id":null}`...)
	}
	b = jsonscan.AppendQuoted(b, names[0])
	b = append(b, `,"last_id":`...)
	b = jsonscan.AppendQuoted(b, names[len(names)-1])
	return append(b, '}')
}
