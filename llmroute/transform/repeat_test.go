package transform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// recorder notes every write with what the guard had been given by then.
type recorder struct {
	buf    bytes.Buffer
	writes int
}

func (r *recorder) Write(p []byte) (int, error) {
	r.writes++
	return r.buf.Write(p)
}

func guardEv(key, text string) string {
	b, _ := json.Marshal(map[string]string{key: text})
	return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + string(b) + `,"finish_reason":null}]}` + "\n\n"
}

func guardDeltas(text string, n int) []string {
	rs := []rune(text)
	var out []string
	for i := 0; i < len(rs); i += n {
		out = append(out, string(rs[i:min(i+n, len(rs))]))
	}
	return out
}

// guardText reassembles the text of a chat stream.
func guardText(t *testing.T, s string) (content, reasoning string) {
	t.Helper()
	for _, ev := range strings.Split(strings.TrimSpace(s), "\n\n") {
		data := strings.TrimPrefix(ev, "data: ")
		if data == "[DONE]" {
			continue
		}
		var ch chunkView
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		for _, c := range ch.Choices {
			content += c.Delta.Content
			reasoning += c.Delta.ReasoningContent
		}
	}
	return content, reasoning
}

// TestRepeatGuardPassesText: text with no loop goes on at once, each event
// in the Write that completed it, byte for byte; a run that breaks is held
// then released as it came.
func TestRepeatGuardPassesText(t *testing.T) {
	text := "Intro. " + strings.Repeat("=", 40) + "\nThen prose with no loop, and ha ha ha, then the end."
	var in bytes.Buffer
	var rec recorder
	g := NewRepeatGuard(&rec, 400, 200)
	held := false
	for _, d := range guardDeltas(text, 5) {
		ev := guardEv("content", d)
		in.WriteString(ev)
		// Cut each event in two writes: events straddle reads.
		if _, err := g.Write([]byte(ev[:len(ev)/2])); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Write([]byte(ev[len(ev)/2:])); err != nil {
			t.Fatal(err)
		}
		if g.Holding() {
			held = true
		} else if rec.buf.String() != in.String() {
			t.Fatalf("after %q the client has %d bytes, want all %d", d, rec.buf.Len(), in.Len())
		}
	}
	if !held {
		t.Error("the rule of 40 '=' was never held (a run of two copies and 16 runes is evidence)")
	}
	in.WriteString("data: [DONE]\n\n")
	if _, err := g.Write([]byte("data: [DONE]\n\n")); err != nil {
		t.Fatal(err)
	}
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	if rec.buf.String() != in.String() {
		t.Fatalf("stream changed:\n%s\nwant\n%s", rec.buf.String(), in.String())
	}
}

// TestRepeatGuardTrips: a loop is held from the event that made it
// evidence, dropped on confirmation, and the client gets the rest of the
// copy it was in; Write says ErrRepeat and takes nothing more.
func TestRepeatGuardTrips(t *testing.T) {
	for _, tc := range []struct{ name, key, prefix, unit string }{
		{"content", "content", "Well: ", "I do not know the answer to that. "},
		{"reasoning", "reasoning_content", "Hmm. ", "我需要再想一想。"},
		{"one rune", "content", "Wow", "!"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec recorder
			g := NewRepeatGuard(&rec, 400, 200)
			var err error
			sent := 0
			for _, d := range guardDeltas(tc.prefix+strings.Repeat(tc.unit, 1000/utf8.RuneCountInString(tc.unit)+1), 8) {
				if _, err = g.Write([]byte(guardEv(tc.key, d))); err != nil {
					break
				}
				sent++
			}
			if !errors.Is(err, ErrRepeat) || g.Trip() == nil {
				t.Fatalf("no trip after %d deltas: %v", sent, err)
			}
			if _, err := g.Write([]byte(guardEv(tc.key, "more"))); !errors.Is(err, ErrRepeat) {
				t.Errorf("a write after the trip: %v", err)
			}
			trip := g.Trip()
			if trip.Reasoning != (tc.key != "content") || trip.Unit == "" || trip.Span < 400 {
				t.Errorf("trip %+v", trip)
			}
			content, reasoning := guardText(t, rec.buf.String())
			got := content
			if trip.Reasoning {
				got = reasoning
			}
			run := strings.TrimPrefix(got, tc.prefix[:len(tc.prefix)-1])
			if n := utf8.RuneCountInString(run); n > 2*utf8.RuneCountInString(tc.unit)+16 || !strings.Contains(got, tc.unit) {
				t.Errorf("the client has %q: want the prefix and one or two copies of the unit", got)
			}
			if !strings.HasSuffix(got, trip.Kept) {
				t.Errorf("kept %q is not the end of what the client has %q", trip.Kept, got)
			}
			// Continue starts over: the stream goes on.
			g.Continue()
			if _, err := g.Write([]byte(guardEv(tc.key, " and now something else."))); err != nil || g.Trip() != nil {
				t.Errorf("after Continue: %v", err)
			}
		})
	}
}

// TestRepeatGuardNonText: a tool call, a finish or [DONE] ends a held run:
// the held events go out first, as they came.
func TestRepeatGuardNonText(t *testing.T) {
	var rec recorder
	g := NewRepeatGuard(&rec, 400, 200)
	var in strings.Builder
	for _, d := range guardDeltas("x "+strings.Repeat("ab", 30), 4) {
		ev := guardEv("content", d)
		in.WriteString(ev)
		_, _ = g.Write([]byte(ev))
	}
	if !g.Holding() {
		t.Fatal("a run of 60 runes of period 2 is not held")
	}
	tool := `data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"abababababababab"}}]}}]}` + "\n\n"
	in.WriteString(tool)
	_, _ = g.Write([]byte(tool))
	if g.Holding() || rec.buf.String() != in.String() {
		t.Fatalf("after a tool call: holding %v, client has\n%s", g.Holding(), rec.buf.String())
	}
}

// TestRepeatGuardNoAllocs: following a stream with no loop allocates
// nothing per event once the buffers have grown.
func TestRepeatGuardNoAllocs(t *testing.T) {
	// 400 distinct deltas: replayed, their text repeats only with a
	// period far above repeat_max_period, so nothing is ever held.
	var evs [][]byte
	for i := range 400 {
		evs = append(evs, []byte(guardEv("content", fmt.Sprintf("word%d, ", i))))
	}
	g := NewRepeatGuard(discardW{}, 400, 200)
	for _, ev := range evs {
		_, _ = g.Write(ev)
	}
	i := 0
	allocs := testing.AllocsPerRun(200, func() {
		_, _ = g.Write(evs[i%len(evs)])
		i++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per event", allocs)
	}
	if g.Trip() != nil || g.Holding() {
		t.Fatal("the guard held or tripped on text with no loop")
	}
}

type discardW struct{}

func (discardW) Write(p []byte) (int, error) { return len(p), nil }

// TestRepeatGuardTemplate: a chunk read by its likeness to the last one
// must be that chunk with another string, never a chunk whose middle holds
// more members: such a chunk takes the full parse (here, a tool call).
func TestRepeatGuardTemplate(t *testing.T) {
	var rec recorder
	g := NewRepeatGuard(&rec, 400, 200)
	_, _ = g.Write([]byte(guardEv("content", "first")))
	var text [2][]byte
	crafted := []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a","tool_calls":[{"index":0}],"x":"b"},"finish_reason":null}]}`)
	if g.fromTemplate(crafted, &text) {
		t.Fatalf("a chunk with a tool call was read as content %q", text[0])
	}
	if g.chunkText(crafted, &text) || !g.State().ToolCall {
		t.Fatal("the full parse missed the tool call")
	}
	plain := []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"next \"one\""},"finish_reason":null}]}`)
	if !g.fromTemplate(plain, &text) || string(text[0]) != `next "one"` {
		t.Fatalf("the plain chunk was not read by the template: %q", text[0])
	}
}

// BenchmarkRepeatGuardStream: the guard stage over a 24-chunk chat stream
// of varied words (no loop), per stream.
func BenchmarkRepeatGuardStream(b *testing.B) {
	words := strings.Fields("Measure first: profile the proxy under the same load, compare the allocation views, and only then change the hot path, one thing at a time, re-running.")
	var stream []byte
	stream = append(stream, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n"...)
	for i := 0; i < 24; i++ {
		stream = append(stream, guardEv("content", " "+words[i%len(words)])...)
	}
	stream = append(stream, "data: [DONE]\n\n"...)
	g := NewRepeatGuard(discardW{}, 400, 200)
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		g.Reset(discardW{})
		for i := 0; i < len(stream); i += 256 {
			_, _ = g.Write(stream[i:min(i+256, len(stream))])
		}
	}
}
