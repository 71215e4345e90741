package transform

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

// chunkings exercises transport splits at many offsets: whole, byte by byte,
// and several co-prime sizes so tags, CRLFs and escapes fall on boundaries.
var chunkings = [][]int{nil, {1}, {2}, {3}, {5}, {7}, {13}, {64}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {100, 1}}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := "testdata/" + name
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("output differs from %s:\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestStreamMiniMax(t *testing.T) {
	in := readFixture(t, "minimax_stream.sse")
	wantC := "\n\n2 + 2 = **4** (use <b>bold</b> and a < sign)\n Yes, 4.<"
	wantR := "\nThe user asks for 2+2. Simple arithmetic — «просто».\nSecond thought: double-check."
	for _, mode := range []ThinkMode{ThinkSplit, ThinkStrip} {
		t.Run(mode.String(), func(t *testing.T) {
			whole, events := runStream(t, mode, in, nil)
			golden(t, "minimax_stream."+mode.String()+".golden", whole)
			for _, sizes := range chunkings {
				out, _ := runStream(t, mode, in, sizes)
				if !bytes.Equal(out, whole) {
					t.Fatalf("chunking %v changed the output:\n%s", sizes, out)
				}
			}
			st := collectStream(t, whole)
			if st.content[0] != wantC {
				t.Errorf("content = %q\nwant      %q", st.content[0], wantC)
			}
			r := wantR
			if mode == ThinkStrip {
				r = ""
			}
			if st.reasoning[0] != r {
				t.Errorf("reasoning = %q\nwant        %q", st.reasoning[0], r)
			}
			if st.done != 1 {
				t.Errorf("[DONE] count %d", st.done)
			}
			if strings.Contains(string(whole), "think") {
				t.Error("a tag leaked")
			}
			// CRLF framing kept everywhere, the keepalive untouched, and the
			// usage chunk (no content change) byte for byte.
			if n := strings.Count(string(whole), "\n"); n != strings.Count(string(whole), "\r\n") {
				t.Error("bare LF in CRLF stream")
			}
			if !bytes.Contains(whole, []byte("\r\n\r\n: keepalive\r\n\r\n")) {
				t.Error("keepalive comment lost")
			}
			// The last delta chunk (finish_reason, placeholder usage) needs
			// no change: byte for byte.
			frames := bytes.SplitAfter(in, []byte("\r\n\r\n"))
			lastDelta, final := frames[len(frames)-4], frames[len(frames)-3]
			if !bytes.Contains(whole, lastDelta) {
				t.Error("unchanged finish chunk modified")
			}
			// MiniMax's closing chat.completion frame repeats the whole text
			// in message.content: split on its own, everything else kept.
			var fin struct {
				Object  string `json:"object"`
				Choices []struct {
					Message struct {
						Content          string  `json:"content"`
						ReasoningContent *string `json:"reasoning_content"`
					} `json:"message"`
				} `json:"choices"`
				Usage struct {
					TotalTokens int `json:"total_tokens"`
				} `json:"usage"`
			}
			outFinal := events[len(events)-3]
			if err := json.Unmarshal(bytes.TrimPrefix(bytes.TrimSpace(outFinal), []byte("data: ")), &fin); err != nil {
				t.Fatalf("final frame %q: %v", outFinal, err)
			}
			if fin.Object != "chat.completion" || fin.Usage.TotalTokens != 143 || fin.Choices[0].Message.Content != wantC {
				t.Errorf("final frame: %+v", fin)
			}
			if rc := fin.Choices[0].Message.ReasoningContent; (mode == ThinkSplit) != (rc != nil && *rc == wantR) {
				t.Errorf("final frame reasoning: %v", rc)
			}
			if head := final[:bytes.Index(final, []byte(`"content"`))]; !bytes.HasPrefix(outFinal, head) {
				t.Error("final frame prefix changed")
			}
			if tail := final[bytes.Index(final, []byte(`,"role":"assistant","name"`)):]; !bytes.HasSuffix(outFinal, tail) && mode == ThinkStrip {
				t.Error("final frame suffix changed")
			}
			// The held "<" is flushed in a synthetic chunk right before [DONE].
			last := string(events[len(events)-2])
			if !strings.HasPrefix(last, `data: {"id":"05b7e4a1c9f0d3e2b8a6f4c1d0e9b7a3","object":"chat.completion.chunk","created":1751000000,"model":"MiniMax-M1","choices":[{"index":0,"delta":{"content":"<"}}]}`) {
				t.Errorf("synthetic flush chunk = %q", last)
			}
			if string(events[len(events)-1]) != "data: [DONE]\r\n\r\n" {
				t.Errorf("last event %q", events[len(events)-1])
			}
			// Exactly one emit per input event (9 chunks + keepalive + final
			// frame + DONE) plus the synthetic one.
			if len(events) != 13 {
				t.Errorf("%d events emitted", len(events))
			}
		})
	}
}

func TestStreamPassthroughFixtures(t *testing.T) {
	for _, name := range []string{"deepseek_stream.sse", "toolcalls_stream.sse"} {
		in := readFixture(t, name)
		for _, mode := range []ThinkMode{ThinkSplit, ThinkStrip, ThinkOff} {
			for _, sizes := range chunkings {
				out, events := runStream(t, mode, in, sizes)
				if !bytes.Equal(out, in) {
					t.Fatalf("%s %v %v: not byte for byte:\n%s", name, mode, sizes, out)
				}
				// Unchanged events of one Write go out in one emit; written
				// byte by byte, each event is its own emit.
				if sizes == nil && len(events) != 1 {
					t.Fatalf("%s: %d emits for one write", name, len(events))
				}
				if len(sizes) == 1 && sizes[0] == 1 && len(events) != len(parseSSE(in)) {
					t.Fatalf("%s: %d emits for %d events", name, len(events), len(parseSSE(in)))
				}
			}
		}
	}
}

func TestStreamFraming(t *testing.T) {
	chunk := func(content string) string {
		return `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":` + string(mustJSON(content)) + `}}]}`
	}
	cases := []struct {
		name    string
		in      string
		want    string
		mode    ThinkMode
		nEvents int
	}{
		{"LF", "data: " + chunk("<think>a</think>b") + "\n\n",
			"data: " + `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"b","reasoning_content":"a"}}]}` + "\n\n", ThinkSplit, 1},
		{"CR only", "data: " + chunk("<think>a</think>b") + "\r\r",
			"data: " + `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"b","reasoning_content":"a"}}]}` + "\r\r", ThinkSplit, 1},
		{"strip", "data:" + chunk("x<think>a</think>b") + "\n\n",
			"data:" + `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"xb"}}]}` + "\n\n", ThinkStrip, 1},
		{"other fields kept", "event: message\nid: 42\nretry: 1000\n: note\ndata: " + chunk("<think>a</think>") + "\n\n",
			"event: message\nid: 42\nretry: 1000\n: note\ndata: " + `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"","reasoning_content":"a"}}]}` + "\n\n", ThinkSplit, 1},
		{"multi-line data rewritten onto one line", "data: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"content\":\"<think>a</think>\"}}]}\nid: 1\n\n",
			"data: {\"choices\":[{\"index\":0, \"delta\":{\"content\":\"\",\"reasoning_content\":\"a\"}}]}\nid: 1\n\n", ThinkSplit, 1},
		{"multi-line data untouched when unchanged", "data: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"content\":\"plain\"}}]}\n\n",
			"data: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"content\":\"plain\"}}]}\n\n", ThinkSplit, 1},
		{"non-JSON data", "data: hello <think>\n\ndata: [1,2]\n\n", "data: hello <think>\n\ndata: [1,2]\n\n", ThinkSplit, 1},
		{"invalid JSON untouched", `data: {"choices":[{"delta":{"content":"<think>x"}}],}` + "\n\n", `data: {"choices":[{"delta":{"content":"<think>x"}}],}` + "\n\n", ThinkSplit, 1},
		{"error event untouched", `data: {"error":{"message":"boom <think>","type":"upstream_error","code":"stream_interrupted"},"choices":[{"delta":{"content":"<think>x"}}]}` + "\n\n",
			`data: {"error":{"message":"boom <think>","type":"upstream_error","code":"stream_interrupted"},"choices":[{"delta":{"content":"<think>x"}}]}` + "\n\n", ThinkSplit, 1},
		{"non-string content untouched", `data: {"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"<think>x</think>"}]}}]}` + "\n\n",
			`data: {"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"<think>x</think>"}]}}]}` + "\n\n", ThinkSplit, 1},
		{"leading blank lines join next event", "\n\n: c\n\n", "\n\n: c\n\n", ThinkSplit, 1},
		{"existing reasoning appended to", `data: {"choices":[{"index":0,"delta":{"reasoning_content":"pre-","content":"<think>x</think>y"}}]}` + "\n\n",
			`data: {"choices":[{"index":0,"delta":{"reasoning_content":"pre-x","content":"y"}}]}` + "\n\n", ThinkSplit, 1},
		{"null reasoning replaced", `data: {"choices":[{"index":0,"delta":{"content":"<think>x</think>y","reasoning_content":null}}]}` + "\n\n",
			`data: {"choices":[{"index":0,"delta":{"content":"y","reasoning_content":"x"}}]}` + "\n\n", ThinkSplit, 1},
		{"escaped tags and output escaping", `data: {"choices":[{"index":0,"delta":{"content":"\u003cthink\u003e\"q\"\n\u003c/think\u003e\u003cb\u003e"}}]}` + "\n\n",
			`data: {"choices":[{"index":0,"delta":{"content":"<b>","reasoning_content":"\"q\"\n"}}]}` + "\n\n", ThinkSplit, 1},
		{"unclosed think at end is reasoning", `data: {"choices":[{"index":0,"delta":{"content":"a<think>b</thi"}}]}` + "\n\n",
			`data: {"choices":[{"index":0,"delta":{"content":"a","reasoning_content":"b"}}]}` + "\n\n" +
				`data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning_content":"</thi"}}]}` + "\n\n", ThinkSplit, 2},
		{"stray close tag is content", `data: {"choices":[{"index":0,"delta":{"content":"a</think>b"}}]}` + "\n\n",
			`data: {"choices":[{"index":0,"delta":{"content":"a</think>b"}}]}` + "\n\n", ThinkSplit, 1},
		{"several choices", `data: {"choices":[{"index":1,"delta":{"content":"<think>r1"}},{"index":0,"delta":{"content":"c0<thin"}}]}` + "\n\n" +
			`data: {"choices":[{"index":0,"delta":{"content":"k>r0</think>d0"}},{"index":1,"delta":{"content":"</think>c1"}}]}` + "\n\n" + "data: [DONE]\n\n",
			`data: {"choices":[{"index":1,"delta":{"content":"","reasoning_content":"r1"}},{"index":0,"delta":{"content":"c0"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"content":"d0","reasoning_content":"r0"}},{"index":1,"delta":{"content":"c1"}}]}` + "\n\n" + "data: [DONE]\n\n", ThinkSplit, 3},
		{"partial trailing event processed at Close", "data: " + chunk("<think>a</think>b"),
			"data: " + `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"b","reasoning_content":"a"}}]}`, ThinkSplit, 1},
		{"partial event then held flush gets framing", "data: " + chunk("a<thi"),
			"data: " + `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
				`data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"<thi"}}]}` + "\n\n", ThinkSplit, 3},
		{"DONE without blank line at EOF", "data: " + chunk("a<") + "\n\ndata: [DONE]",
			"data: " + `{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
				`data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"<"}}]}` + "\n\n" + "data: [DONE]", ThinkSplit, 3},
		{"ThinkOff passes through", "data: " + chunk("<think>a</think>") + "\n\n", "data: " + chunk("<think>a</think>") + "\n\n", ThinkOff, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, sizes := range chunkings {
				out, events := runStream(t, c.mode, []byte(c.in), sizes)
				if string(out) != c.want {
					t.Fatalf("chunking %v:\ngot  %q\nwant %q", sizes, out, c.want)
				}
				if sizes == nil && len(events) != c.nEvents {
					t.Fatalf("%d emits, want %d: %q", len(events), c.nEvents, events)
				}
			}
		})
	}
}

func TestStreamCRLFSplitAcrossWrites(t *testing.T) {
	// The blank line's CR ends a write: the event is emitted at once and the
	// LF that follows is forwarded with the next event.
	var got []string
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { got = append(got, string(ev)); return nil })
	s.Write([]byte("data: {\"choices\":[]}\r\n\r"))
	if len(got) != 1 || got[0] != "data: {\"choices\":[]}\r\n\r" {
		t.Fatalf("event not emitted at its CR: %q", got)
	}
	s.Write([]byte("\ndata: [DONE]\r\n\r\n"))
	s.Close()
	if len(got) != 2 || got[1] != "\ndata: [DONE]\r\n\r\n" {
		t.Fatalf("got %q", got)
	}
}

func TestStreamOversizedEvent(t *testing.T) {
	var out bytes.Buffer
	emits := 0
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { emits++; out.Write(ev); return nil })
	s.SetMaxEventSize(100)
	big := `data: {"choices":[{"index":0,"delta":{"content":"<think>` + strings.Repeat("x", 200) + `</think>"}}]}` + "\n\n"
	small := `data: {"choices":[{"index":0,"delta":{"content":"<think>a</think>b"}}]}` + "\n\n"
	in := big + small
	for i := 0; i < len(in); i += 10 {
		j := min(i+10, len(in))
		s.Write([]byte(in[i:j]))
		if len(s.buf) > s.max {
			t.Fatalf("buffered %d > max", len(s.buf))
		}
	}
	s.Close()
	want := big + `data: {"choices":[{"index":0,"delta":{"content":"b","reasoning_content":"a"}}]}` + "\n\n"
	if out.String() != want {
		t.Fatalf("got  %q\nwant %q", out.String(), want)
	}
	if n := s.Oversized(); n != 1 {
		t.Errorf("Oversized() = %d, want 1", n)
	}
	// A complete oversized event arriving in one write also passes raw.
	out.Reset()
	s.Reset(ThinkSplit, func(ev []byte) error { out.Write(ev); return nil })
	if s.Oversized() != 0 || s.max != MaxEventSize {
		t.Fatalf("Reset kept the bound or the count: max %d, oversized %d", s.max, s.Oversized())
	}
	s.SetMaxEventSize(100)
	s.Write([]byte(big))
	s.Close()
	if out.String() != big || s.Oversized() != 1 {
		t.Fatalf("got %q, oversized %d", out.String(), s.Oversized())
	}
}

// TestStreamRewritesEventsUpToTheBound: an event of several MiB (a long
// answer in one chunk, issue 10 item 14) is rewritten under the
// default bound; the old 1 MiB bound passed it through with its tags.
func TestStreamRewritesEventsUpToTheBound(t *testing.T) {
	var out bytes.Buffer
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { out.Write(ev); return nil })
	text := strings.Repeat("y", 3<<20)
	ev := `data: {"choices":[{"index":0,"delta":{"content":"<think>r</think>` + text + `"}}]}` + "\n\n"
	for i := 0; i < len(ev); i += 32 << 10 {
		s.Write([]byte(ev[i:min(i+32<<10, len(ev))]))
	}
	s.Close()
	want := `data: {"choices":[{"index":0,"delta":{"content":"` + text + `","reasoning_content":"r"}}]}` + "\n\n"
	if out.String() != want || s.Oversized() != 0 {
		t.Fatalf("a %d-byte event was not rewritten (oversized %d): starts %.120q", len(ev), s.Oversized(), out.String())
	}
}

func TestStreamBatchesUnchangedEvents(t *testing.T) {
	var got []string
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { got = append(got, string(ev)); return nil })
	a := `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n"
	b := `data: {"choices":[{"index":0,"delta":{"content":"<think>b</think>"}}]}` + "\n\n"
	s.Write([]byte(a + a + ": ka\n\n" + b + a + a + "data: {\"par"))
	want := []string{a + a + ": ka\n\n", `data: {"choices":[{"index":0,"delta":{"content":"","reasoning_content":"b"}}]}` + "\n\n", a + a}
	if len(got) != len(want) {
		t.Fatalf("emits %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("emit %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func TestStreamEmitError(t *testing.T) {
	boom := errors.New("client gone")
	calls := 0
	s := NewStreamRewriter(ThinkSplit, func([]byte) error { calls++; return boom })
	n, err := s.Write([]byte("data: 1\n\ndata: 2\n\n"))
	if err != boom || n != 0 || calls != 1 {
		t.Fatalf("Write = %d, %v after %d calls", n, err, calls)
	}
	if _, err := s.Write([]byte("data: 3\n\n")); err != boom {
		t.Fatal("error not sticky")
	}
	if s.Close() != boom {
		t.Fatal("Close lost the error")
	}
	// Reset clears it; write after Close is refused.
	var out []byte
	s.Reset(ThinkSplit, func(ev []byte) error { out = append(out, ev...); return nil })
	if _, err := s.Write([]byte("data: 1\n\n")); err != nil || string(out) != "data: 1\n\n" {
		t.Fatalf("after Reset: %v %q", err, out)
	}
	s.Close()
	if _, err := s.Write([]byte("x")); err == nil {
		t.Fatal("Write after Close accepted")
	}
}

func TestStreamResetClearsState(t *testing.T) {
	var out []byte
	emit := func(ev []byte) error { out = append(out, ev...); return nil }
	s := NewStreamRewriter(ThinkSplit, emit)
	s.Write([]byte(`data: {"choices":[{"index":0,"delta":{"content":"<think>x"}}]}` + "\n\ndata: {\"a\":"))
	s.Reset(ThinkSplit, emit)
	out = out[:0]
	in := `data: {"choices":[{"index":0,"delta":{"content":"plain"}}]}` + "\n\n"
	s.Write([]byte(in))
	s.Close()
	if string(out) != in {
		t.Fatalf("state leaked across Reset: %q", out)
	}
}

func TestStreamDeepSeekSplitIdentical(t *testing.T) {
	// DeepSeek already splits reasoning natively: in split mode the stream
	// must be byte-for-byte identical even though reasoning text mentions
	// "<think>" (it is in reasoning_content, not content).
	in := readFixture(t, "deepseek_stream.sse")
	out, _ := runStream(t, ThinkSplit, in, []int{17})
	if !bytes.Equal(in, out) {
		t.Fatal("DeepSeek stream modified")
	}
	st := collectStream(t, out)
	if st.content[0] != "Yes: 1 < 2." || !strings.HasPrefix(st.reasoning[0], "Okay") {
		t.Fatalf("%+v", st)
	}
}

func TestSyntheticChunkIsValidJSON(t *testing.T) {
	in := `data: {"id":"x\"y","created":1,"model":"m\u00e9","choices":[{"index":3,"delta":{"content":"\u003cthink\u003eabc\u003c/thi"}}]}` + "\r\n\r\n"
	out, events := runStream(t, ThinkSplit, []byte(in), nil)
	if len(events) != 2 {
		t.Fatalf("events %q", events)
	}
	for _, ev := range parseSSE(out) {
		if !json.Valid([]byte(ev.data)) {
			t.Fatalf("invalid JSON %q", ev.data)
		}
	}
	st := collectStream(t, out)
	if st.reasoning[3] != "abc</thi" || st.content[3] != "" {
		t.Fatalf("%+v", st)
	}
	if !strings.HasSuffix(string(out), "\r\n\r\n") {
		t.Fatal("synthetic chunk did not follow the stream's CRLF")
	}
}
