package transform

import (
	"bytes"
	"encoding/json"
)

// Usage is the token accounting an upstream reports. The chat shape
// (prompt_tokens, completion_tokens, their details), Anthropic's
// (input_tokens, output_tokens, cache_read_input_tokens; message_start and
// message_delta) and Responses' (input_tokens, output_tokens, their details)
// all map onto it. Each field keeps the largest value seen: Anthropic
// repeats cumulative counts, chat sends its usage once.
type Usage struct {
	Input, Output, CachedInput, Reasoning int64
	Seen                                  bool // a usage object was read
}

// maxUsagePending bounds what UsageScanner holds of a usage object split
// over writes.
const maxUsagePending = 4 << 10

// UsageScanner finds usage objects in a response body written to it in
// pieces. It looks at a piece only when it contains `"usage"`
// (bytes.Index), so a body without usage costs one scan and no parse.
type UsageScanner struct {
	Usage
	pending []byte // the start of a usage object cut by the end of a piece
}

var usageKey = []byte(`"usage"`)

// Reset readies the scanner for another body.
func (s *UsageScanner) Reset() {
	s.Usage = Usage{}
	s.pending = s.pending[:0]
}

// Write scans p; it never fails.
func (s *UsageScanner) Write(p []byte) {
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

// scan reads every usage object in p; one cut at the end is kept pending.
func (s *UsageScanner) scan(p []byte) {
	for {
		k := bytes.Index(p, usageKey)
		if k < 0 {
			// The key itself may be cut: keep a tail that starts it.
			for n := len(usageKey) - 1; n > 0; n-- {
				if bytes.HasSuffix(p, usageKey[:n]) {
					s.keep(p[len(p)-n:])
					break
				}
			}
			return
		}
		if k > 0 && p[k-1] == '\\' {
			// `\"usage\"` inside a JSON string: text, not a key.
			p = p[k+len(usageKey):]
			continue
		}
		rest := p[k+len(usageKey):]
		i := skipSpace(rest, 0)
		if i < len(rest) && rest[i] != ':' {
			p = rest
			continue
		}
		i = skipSpace(rest, i+1)
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

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// objectEnd returns the length of the JSON object starting at b[0] ('{'),
// or -1 when b ends first.
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

// usageJSON is every shape's fields at once.
type usageJSON struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	CacheReadInput      int64 `json:"cache_read_input_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

func (s *UsageScanner) read(obj []byte) {
	var u usageJSON
	if json.Unmarshal(obj, &u) != nil {
		return
	}
	s.Seen = true
	s.Input = max(s.Input, u.PromptTokens, u.InputTokens)
	s.Output = max(s.Output, u.CompletionTokens, u.OutputTokens)
	s.CachedInput = max(s.CachedInput, u.PromptTokensDetails.CachedTokens, u.InputTokensDetails.CachedTokens, u.CacheReadInput)
	s.Reasoning = max(s.Reasoning, u.CompletionTokensDetails.ReasoningTokens, u.OutputTokensDetails.ReasoningTokens)
}
