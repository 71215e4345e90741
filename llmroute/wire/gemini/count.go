package gemini

import (
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// mediaTokens is what one inlineData or fileData part counts in
// CountTokensEstimate: Google's count for an image (258), base64 not counted.
const mediaTokens = 258

// CountTokensEstimate is a local estimate of a countTokens request's input
// tokens, for when no native upstream can answer: the bytes of every string
// value under contents, systemInstruction and tools (also inside
// generateContentRequest, the REST form), divided by 4 and rounded up, plus
// 258 per inlineData or fileData part (its data not counted), plus 4 per
// content for role and framing. thoughtSignature values are not counted.
// A body that is not a JSON object is an *Error (400).
func CountTokensEstimate(body []byte) (int, error) {
	i := jsonscan.SkipWS(body, 0)
	if !jsonscan.Valid(body) || body[i] != '{' {
		return 0, badRequest("", "request body is not a valid JSON object")
	}
	var c counter
	c.top(body[i:], 0)
	return c.tokens + (c.bytes+3)/4, nil
}

type counter struct{ bytes, tokens int }

// top counts the members of a request object; depth stops a nested
// generateContentRequest from recursing further.
func (c *counter) top(obj []byte, depth int) {
	it := jsonscan.IterObject(obj, 0, false)
	var m jsonscan.Member
	for it.Next(&m) {
		v := obj[m.Vs:m.Ve]
		switch {
		case jsonscan.KeyIs(obj, &m, "contents"):
			if v[0] == '[' {
				jsonscan.EachElem(v, 0, func(vs, ve int) bool {
					c.tokens += 4
					c.walk(v[vs:ve])
					return true
				})
			}
		case jsonscan.KeyIs(obj, &m, "systemInstruction"), jsonscan.KeyIs(obj, &m, "tools"):
			c.walk(v)
		case jsonscan.KeyIs(obj, &m, "generateContentRequest"):
			if depth == 0 && v[0] == '{' {
				c.top(v, 1)
			}
		}
	}
}

// walk counts the string values in v, media parts at a fixed price.
func (c *counter) walk(v []byte) {
	switch v[0] {
	case '"':
		c.bytes += len(v) - 2
	case '[':
		jsonscan.EachElem(v, 0, func(vs, ve int) bool {
			c.walk(v[vs:ve])
			return true
		})
	case '{':
		it := jsonscan.IterObject(v, 0, false)
		var m jsonscan.Member
		for it.Next(&m) {
			switch {
			case jsonscan.KeyIs(v, &m, "inlineData"), jsonscan.KeyIs(v, &m, "fileData"):
				c.tokens += mediaTokens
			case jsonscan.KeyIs(v, &m, "thoughtSignature"):
			default:
				c.walk(v[m.Vs:m.Ve])
			}
		}
	}
}

// CountTokensBody is the countTokens answer for n input tokens:
// {"totalTokens":n}.
func CountTokensBody(n int) []byte {
	b := append([]byte(nil), `{"totalTokens":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '}')
}

// ModelsBody is the GET …/v1beta/models answer: {"models":[…]} with one
// ModelBody object per name, in the given order, on one page (no
// nextPageToken).
func ModelsBody(names []string) []byte {
	b := append([]byte(nil), `{"models":[`...)
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendModelObject(b, n)
	}
	return append(b, "]}"...)
}

// ModelBody is the GET …/v1beta/models/{name} answer:
// {"name":"models/<name>","baseModelId","version":"llm_route","displayName",
// "supportedGenerationMethods":["generateContent","streamGenerateContent","countTokens"]}.
func ModelBody(name string) []byte {
	return appendModelObject(nil, name)
}

func appendModelObject(b []byte, name string) []byte {
	b = append(b, `{"name":`...)
	b = appendQuotedText(b, "models/"+name)
	b = append(b, `,"baseModelId":`...)
	b = appendQuotedText(b, name)
	b = append(b, `,"version":"llm_route","displayName":`...)
	b = appendQuotedText(b, name)
	return append(b, `,"supportedGenerationMethods":["generateContent","streamGenerateContent","countTokens"]}`...)
}
