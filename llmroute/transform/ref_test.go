package transform

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Reference implementations used by the tests: deliberately naive, written
// against encoding/json maps and whole strings, independent of the code under
// test.

// decodeAny unmarshals with UseNumber so numbers compare by their text.
func decodeAny(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errTrailing
	}
	return v, nil
}

var errTrailing = jsonErr("trailing data")

type jsonErr string

func (e jsonErr) Error() string { return string(e) }

// refMerge is the patch deep merge on maps: objects merge recursively,
// anything else replaces.
func refMerge(dst map[string]any, patch map[string]any) {
	for k, pv := range patch {
		pm, ok := pv.(map[string]any)
		if !ok {
			dst[k] = deepCopy(pv)
			continue
		}
		if dm, ok := dst[k].(map[string]any); ok {
			refMerge(dm, pm)
			continue
		}
		nm := map[string]any{}
		refMerge(nm, pm)
		dst[k] = nm
	}
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = deepCopy(e)
		}
		return a
	}
	return v
}

// normJSON re-encodes JSON canonically (sorted keys) for comparison.
func normJSON(t testing.TB, b []byte) string {
	t.Helper()
	v, err := decodeAny(b)
	if err != nil {
		t.Fatalf("invalid JSON %q: %v", b, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// refSplit is the whole-string think-tag semantics the incremental splitter
// must reproduce: see splitter's doc comment.
func refSplit(s string) (content, reasoning string) {
	var c, r strings.Builder
	in := false
	for {
		tag := "<think>"
		if in {
			tag = "</think>"
		}
		i := strings.Index(s, tag)
		if i < 0 {
			break
		}
		if in {
			r.WriteString(s[:i])
		} else {
			c.WriteString(s[:i])
		}
		s = s[i+len(tag):]
		in = !in
	}
	if in {
		r.WriteString(s)
	} else {
		c.WriteString(s)
	}
	return c.String(), r.String()
}

// sseEvent is one parsed SSE event of the test parser.
type sseEvent struct {
	data    string
	hasData bool
	fields  []string // non-data lines, verbatim
}

// parseSSE is an independent SSE parser (WHATWG rules) for checking output.
func parseSSE(b []byte) []sseEvent {
	s := strings.ReplaceAll(string(b), "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	var evs []sseEvent
	var cur sseEvent
	var data []string
	for _, line := range strings.Split(s, "\n") {
		if line == "" {
			if cur.hasData || len(cur.fields) > 0 {
				cur.data = strings.Join(data, "\n")
				evs = append(evs, cur)
			}
			cur, data = sseEvent{}, nil
			continue
		}
		if strings.HasPrefix(line, "data:") || line == "data" {
			v := strings.TrimPrefix(strings.TrimPrefix(line, "data"), ":")
			v = strings.TrimPrefix(v, " ")
			data = append(data, v)
			cur.hasData = true
			continue
		}
		cur.fields = append(cur.fields, line)
	}
	if cur.hasData || len(cur.fields) > 0 {
		cur.data = strings.Join(data, "\n")
		evs = append(evs, cur)
	}
	return evs
}

// streamText collects, per choice index, the content and reasoning_content
// text of every chunk in an SSE stream.
type streamText struct {
	content, reasoning map[int]string
	done               int
	// Whole "message" choices inside the stream (MiniMax's closing frame).
	msgContent, msgReasoning map[int]string
}

func collectStream(t testing.TB, out []byte) streamText {
	t.Helper()
	st := streamText{content: map[int]string{}, reasoning: map[int]string{}, msgContent: map[int]string{}, msgReasoning: map[int]string{}}
	type text struct {
		Content          *string `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
	}
	for _, ev := range parseSSE(out) {
		if !ev.hasData {
			continue
		}
		if ev.data == "[DONE]" {
			st.done++
			continue
		}
		var chunk struct {
			Choices []struct {
				Index   int   `json:"index"`
				Delta   text  `json:"delta"`
				Message *text `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &chunk); err != nil {
			t.Fatalf("invalid JSON data %q: %v", ev.data, err)
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != nil {
				st.content[c.Index] += *c.Delta.Content
			}
			if c.Delta.ReasoningContent != nil {
				st.reasoning[c.Index] += *c.Delta.ReasoningContent
			}
			if c.Message != nil && c.Message.Content != nil {
				st.msgContent[c.Index] = *c.Message.Content
				if c.Message.ReasoningContent != nil {
					st.msgReasoning[c.Index] = *c.Message.ReasoningContent
				}
			}
		}
	}
	return st
}

// pipe feeds input to a rewriter in the given piece sizes (cycled) and
// returns everything emitted; the cheap variant for fuzzing.
func pipe(t testing.TB, mode ThinkMode, input []byte, sizes []int) []byte {
	out := make([]byte, 0, len(input)+len(input)/4)
	s := NewStreamRewriter(mode, func(ev []byte) error { out = append(out, ev...); return nil })
	for k := 0; len(input) > 0; k++ {
		n := len(input)
		if len(sizes) > 0 {
			n = min(max(sizes[k%len(sizes)], 1), len(input))
		}
		if _, err := s.Write(input[:n]); err != nil {
			t.Fatal(err)
		}
		input = input[n:]
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// runStream feeds input to a rewriter in the given piece sizes (cycled) and
// returns everything emitted, checking each emit is non-empty.
func runStream(t testing.TB, mode ThinkMode, input []byte, sizes []int) ([]byte, [][]byte) {
	t.Helper()
	var out []byte
	var events [][]byte
	s := NewStreamRewriter(mode, func(ev []byte) error {
		if len(ev) == 0 {
			t.Fatalf("empty emit")
		}
		out = append(out, ev...)
		events = append(events, append([]byte(nil), ev...))
		return nil
	})
	for k := 0; len(input) > 0; k++ {
		n := len(input)
		if len(sizes) > 0 {
			n = sizes[k%len(sizes)]
			if n <= 0 {
				n = 1
			}
			if n > len(input) {
				n = len(input)
			}
		}
		if w, err := s.Write(input[:n]); err != nil || w != n {
			t.Fatalf("Write = %d, %v", w, err)
		}
		input = input[n:]
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return out, events
}
