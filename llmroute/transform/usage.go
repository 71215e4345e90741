package transform

import (
	"bytes"
	"strings"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Usage is the token accounting an upstream reports. Input counts every
// prompt token, those read from a cache included (CachedInput of them):
// Anthropic's input_tokens leaves the cached ones out, so they are added
// back. The chat shape
// (prompt_tokens, completion_tokens, their details), Anthropic's
// (input_tokens, output_tokens, cache_read_input_tokens; message_start and
// message_delta), Responses' (input_tokens, output_tokens, their details)
// and Gemini's usageMetadata (promptTokenCount, cachedContentTokenCount,
// candidatesTokenCount and thoughtsTokenCount, both output) all map onto
// it. Each field keeps the largest value seen: Anthropic and Gemini repeat
// cumulative counts, chat sends its usage once.
type Usage struct {
	Input, Output, CachedInput, Reasoning int64
	Seen                                  bool // a usage object was read
	// CacheReported: the upstream gave a cached-token count (a cached
	// member in its usage, or llama.cpp's timings.cache_n), so a
	// CachedInput of 0 means nothing was reused rather than not known.
	CacheReported bool
}

// maxUsagePending bounds what UsageScanner holds of a usage object split
// over writes.
const maxUsagePending = 4 << 10

// UsageScanner finds usage objects in a response body written to it in
// pieces. It looks at a piece only when it contains `"usage"`
// (bytes.Index), so a body without usage costs one scan and no parse.
type UsageScanner struct {
	Usage
	// Timings also reads llama.cpp's "timings" objects (cache_n, the
	// prompt tokens reused; prompt_n, those computed): servers that put
	// no cached count in their usage still report their cache there.
	Timings bool
	pending []byte // the start of a usage object cut by the end of a piece
	tpend   []byte // the same for a timings object
}

var (
	timingsKey  = []byte(`"timings"`)
	timingsTail = timingsKey[1:]
)

var (
	usageWord = []byte("usage")
	// metaKey is Gemini's "usageMetadata", the longer of the two keys
	// that start with the word; metaTail what follows the word in it.
	metaKey  = []byte(`"usageMetadata"`)
	metaTail = metaKey[len(`"usage`):]
)

// Reset readies the scanner for another body.
func (s *UsageScanner) Reset() {
	s.Usage = Usage{}
	s.pending = s.pending[:0]
	s.tpend = s.tpend[:0]
}

// Write scans p; it never fails.
func (s *UsageScanner) Write(p []byte) {
	if s.Timings {
		s.writeTimings(p)
	}
	if len(s.pending) > 0 {
		if len(s.pending)+len(p) > maxUsagePending {
			s.pending = s.pending[:0] // too big to be a usage object: give up on it
		} else {
			s.pending = append(s.pending, p...)
			buf := s.pending
			s.pending = nil
			s.scan(buf)
			if s.pending == nil {
				s.pending = buf[:0]
			}
			return
		}
	}
	s.scan(p)
}

// scan reads every usage object in p ("usage" or "usageMetadata"); one
// cut at the end is kept pending. It looks for the word `usage` rather
// than `"usage`: a quote is the most common byte of JSON, so an Index led
// by it stops at every string, while 'u' is rare enough for the SIMD byte
// search to carry the scan.
func (s *UsageScanner) scan(p []byte) {
	for {
		k := bytes.Index(p, usageWord)
		if k < 0 {
			// The key itself may be cut: keep a tail that starts it. (An
			// SSE event ends in a newline, so this loop rarely runs.)
			if len(p) == 0 || bytes.IndexByte(usageWord[:len(usageWord)-1], p[len(p)-1]) < 0 && p[len(p)-1] != '"' {
				return
			}
			for n := len(usageWord); n > 0; n-- {
				if bytes.HasSuffix(p, metaKey[:n]) {
					s.keep(p[len(p)-n:])
					break
				}
			}
			return
		}
		k-- // the opening quote
		if k < 0 || p[k] != '"' || (k > 0 && p[k-1] == '\\') {
			// Not a key, or `\"usage\"` inside a JSON string: text.
			p = p[k+1+len(usageWord):]
			continue
		}
		after := p[k+1+len(usageWord):]
		klen := 0
		switch {
		case len(after) > 0 && after[0] == '"':
			klen = len(`"usage"`)
		case bytes.HasPrefix(after, metaTail):
			klen = len(metaKey)
		case len(after) < len(metaTail) && bytes.HasPrefix(metaTail, after):
			s.keep(p[k:]) // the key is not all here yet
			return
		default:
			p = after // "usageFoo": another member
			continue
		}
		rest := p[k+klen:]
		i := jsonscan.SkipWS(rest, 0)
		if i < len(rest) && rest[i] != ':' {
			p = rest
			continue
		}
		i = jsonscan.SkipWS(rest, i+1)
		if i >= len(rest) {
			s.keep(p[k:])
			return
		}
		if rest[i] != '{' {
			p = rest[i:] // null or another value: no counts
			continue
		}
		end := objectEnd(rest[i:])
		if end < 0 {
			s.keep(p[k:])
			return
		}
		s.read(rest[i : i+end])
		p = rest[i+end:]
	}
}

func (s *UsageScanner) keep(b []byte) {
	if len(b) <= maxUsagePending {
		s.pending = append(s.pending[:0:0], b...)
	}
}

// objectEnd returns the length of the JSON object starting at b[0] ('{'),
// or -1 when b ends first. Unlike jsonscan.SkipValue it only matches braces:
// a piece cut mid-object must read as "not yet", not as malformed.
func objectEnd(b []byte) int {
	depth, inStr := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inStr:
			if c == '\\' {
				i++
			} else if c == '"' {
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// rawUsage is every count of every shape, as one usage object carries
// them (the last of a repeated member wins, as in encoding/json).
type rawUsage struct {
	prompt, completion, input, output, cacheRead int64
	cacheCreation                                int64
	// anthropic: the object has Anthropic's cache members, whose
	// input_tokens leaves out the cached prompt.
	anthropic                            bool
	promptCached, inputCached            int64 // *_tokens_details.cached_tokens
	completionReasoning, outputReasoning int64 // *_tokens_details.reasoning_tokens
	cachedSeen                           bool  // a cached count is among them
	// Gemini's usageMetadata: promptTokenCount, cachedContentTokenCount,
	// candidatesTokenCount, thoughtsTokenCount.
	gPrompt, gCached, gCandidates, gThoughts int64
}

// read takes the counts from one usage object. Nothing else of the object
// is decoded, and nothing is allocated.
func (s *UsageScanner) read(obj []byte) {
	var u rawUsage
	if !readUsageObject(obj, &u, "") {
		return
	}
	s.Seen = true
	if u.anthropic {
		// Input counts every prompt token, as chat and Responses do.
		u.input += u.cacheRead + u.cacheCreation
	}
	s.Input = max(s.Input, u.prompt, u.input, u.gPrompt)
	// Gemini counts its thoughts apart from the candidates; both are
	// output, as chat's completion_tokens includes the reasoning.
	s.Output = max(s.Output, u.completion, u.output, u.gCandidates+u.gThoughts)
	s.CachedInput = max(s.CachedInput, u.promptCached, u.inputCached, u.cacheRead, u.gCached)
	s.CacheReported = s.CacheReported || u.cachedSeen
	s.Reasoning = max(s.Reasoning, u.completionReasoning, u.outputReasoning, u.gThoughts)
}

// readUsageObject walks the members of obj ('{' … '}'); parent names the
// details object obj is ("" at the top). It reports whether obj is well
// formed as far as it reads it.
func readUsageObject(obj []byte, u *rawUsage, parent string) bool {
	i := jsonscan.SkipWS(obj, 1)
	for i < len(obj) && obj[i] != '}' {
		if obj[i] != '"' {
			return false
		}
		end := bytes.IndexByte(obj[i+1:], '"')
		if end < 0 {
			return false
		}
		key := obj[i+1 : i+1+end]
		i = jsonscan.SkipWS(obj, i+end+2)
		if i >= len(obj) || obj[i] != ':' {
			return false
		}
		i = jsonscan.SkipWS(obj, i+1)
		if i >= len(obj) {
			return false
		}
		switch c := obj[i]; {
		case c >= '0' && c <= '9':
			n, j := int64(0), i
			for j < len(obj) && obj[j] >= '0' && obj[j] <= '9' && n < 1<<58 {
				n = n*10 + int64(obj[j]-'0')
				j++
			}
			k := j
			for k < len(obj) && strings.IndexByte("0123456789.eE+-", obj[k]) >= 0 {
				k++
			}
			if k == j { // an integer: a count, if the member is one
				if dst := usageField(u, parent, string(key)); dst != nil {
					*dst = n
				}
			}
			i = k
		case c == '{':
			end := objectEnd(obj[i:])
			if end < 0 {
				return false
			}
			if parent == "" {
				if k := detailsName(key); k != "" && !readUsageObject(obj[i:i+end], u, k) {
					return false
				}
			}
			i += end
		default:
			// A string, null, bool, array or negative number: skip it.
			j := skipUsageValue(obj, i)
			if j < 0 {
				return false
			}
			i = j
		}
		i = jsonscan.SkipWS(obj, i)
		if i < len(obj) && obj[i] == ',' {
			i = jsonscan.SkipWS(obj, i+1)
		}
	}
	return i < len(obj)
}

// detailsName returns the details object a member name is, as a constant
// ("" for any other member), so that nothing of key is retained.
func detailsName(key []byte) string {
	for _, k := range [...]string{"prompt_tokens_details", "input_tokens_details", "completion_tokens_details", "output_tokens_details"} {
		if string(key) == k {
			return k
		}
	}
	return ""
}

// usageField maps a member of the object parent names onto the count it
// carries, nil for any other member.
func usageField(u *rawUsage, parent, key string) *int64 {
	switch parent {
	case "":
		switch key {
		case "prompt_tokens":
			return &u.prompt
		case "completion_tokens":
			return &u.completion
		case "input_tokens":
			return &u.input
		case "output_tokens":
			return &u.output
		case "cache_read_input_tokens":
			u.anthropic, u.cachedSeen = true, true
			return &u.cacheRead
		case "cache_creation_input_tokens":
			u.anthropic = true
			return &u.cacheCreation
		case "promptTokenCount":
			return &u.gPrompt
		case "cachedContentTokenCount":
			u.cachedSeen = true
			return &u.gCached
		case "candidatesTokenCount":
			return &u.gCandidates
		case "thoughtsTokenCount":
			return &u.gThoughts
		}
	case "prompt_tokens_details", "input_tokens_details":
		if key == "cached_tokens" {
			u.cachedSeen = true
			if parent[0] == 'p' {
				return &u.promptCached
			}
			return &u.inputCached
		}
	case "completion_tokens_details", "output_tokens_details":
		if key == "reasoning_tokens" {
			if parent[0] == 'c' {
				return &u.completionReasoning
			}
			return &u.outputReasoning
		}
	}
	return nil
}

// skipUsageValue returns the index just past the scalar or array at b[i], or -1
// when b ends first.
func skipUsageValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1
			}
		}
		return -1
	case '[':
		depth, inStr := 0, false
		for j := i; j < len(b); j++ {
			c := b[j]
			switch {
			case inStr:
				if c == '\\' {
					j++
				} else if c == '"' {
					inStr = false
				}
			case c == '"':
				inStr = true
			case c == '[' || c == '{':
				depth++
			case c == ']' || c == '}':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ' ' && b[j] != '\n' {
		j++
	}
	return j
}

// writeTimings reads the llama.cpp timings objects in p, keeping one cut
// at the end of p for the next write, as Write does for usage.
func (s *UsageScanner) writeTimings(p []byte) {
	if len(s.tpend) > 0 {
		if len(s.tpend)+len(p) > maxUsagePending {
			s.tpend = s.tpend[:0]
		} else {
			buf := append(s.tpend, p...)
			s.tpend = s.tpend[:0]
			s.scanTimings(buf)
			return
		}
	}
	s.scanTimings(p)
}

func (s *UsageScanner) scanTimings(p []byte) {
	for {
		k := bytes.Index(p, timingsTail)
		if k < 1 {
			if k < 0 {
				// A cut key: keep the tail that may start it.
				for n := len(timingsKey) - 1; n > 0; n-- {
					if bytes.HasSuffix(p, timingsKey[:n]) {
						s.tpend = append(s.tpend[:0], p[len(p)-n:]...)
						break
					}
				}
				return
			}
			p = p[len(timingsTail):]
			continue
		}
		start := k - 1
		if p[start] != '"' {
			p = p[k+len(timingsTail):]
			continue
		}
		rest := p[k+len(timingsTail):]
		i := jsonscan.SkipWS(rest, 0)
		if i < len(rest) && rest[i] == ':' {
			i = jsonscan.SkipWS(rest, i+1)
		}
		if i >= len(rest) {
			s.tpend = append(s.tpend[:0], p[start:]...)
			return
		}
		if rest[i] != '{' {
			p = rest[i:]
			continue
		}
		end := objectEnd(rest[i:])
		if end < 0 {
			s.tpend = append(s.tpend[:0], p[start:]...)
			return
		}
		s.readTimings(rest[i : i+end])
		p = rest[i+end:]
	}
}

// readTimings takes cache_n and prompt_n from a timings object: the prompt
// is both together.
func (s *UsageScanner) readTimings(obj []byte) {
	var cacheN, promptN int64
	seen := false
	it := jsonscan.IterObject(obj, 0, false)
	var m jsonscan.Member
	for it.Next(&m) {
		var dst *int64
		switch string(obj[m.Ks:m.Ke]) {
		case "cache_n":
			dst, seen = &cacheN, true
		case "prompt_n":
			dst = &promptN
		default:
			continue
		}
		n := int64(0)
		for _, c := range obj[m.Vs:m.Ve] {
			if c < '0' || c > '9' || n >= 1<<58 {
				break
			}
			n = n*10 + int64(c-'0')
		}
		*dst = n
	}
	if !seen {
		return
	}
	s.Seen, s.CacheReported = true, true
	s.CachedInput = max(s.CachedInput, cacheN)
	s.Input = max(s.Input, cacheN+promptN)
}
