package transform

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestParseThinkMode(t *testing.T) {
	cases := []struct {
		in    string
		mode  ThinkMode
		known bool
	}{
		{"split", ThinkSplit, true}, {"true", ThinkSplit, true}, {" Split ", ThinkSplit, true},
		{"strip", ThinkStrip, true}, {"STRIP", ThinkStrip, true},
		{"off", ThinkOff, true}, {"false", ThinkOff, true}, {"", ThinkOff, true},
		{"yes", ThinkOff, false}, {"1", ThinkOff, false}, {"splitt", ThinkOff, false},
	}
	for _, c := range cases {
		m, known := ParseThinkMode(c.in)
		if m != c.mode || known != c.known {
			t.Errorf("ParseThinkMode(%q) = %v, %v; want %v, %v", c.in, m, known, c.mode, c.known)
		}
	}
	for m, s := range map[ThinkMode]string{ThinkOff: "off", ThinkSplit: "split", ThinkStrip: "strip", 7: "ThinkMode(7)"} {
		if m.String() != s {
			t.Errorf("%d.String() = %q", m, m.String())
		}
		if m < 3 {
			if back, _ := ParseThinkMode(s); back != m {
				t.Errorf("round trip %q", s)
			}
		}
	}
}

// splitPieces runs the incremental splitter over pieces and flushes.
func splitPieces(pieces []string) (string, string) {
	var s splitter
	var c, r, scratch []byte
	for _, p := range pieces {
		c, r, scratch = s.feed([]byte(p), c, r, scratch)
	}
	c, r = s.flush(c, r)
	return string(c), string(r)
}

func TestSplitterMatchesReference(t *testing.T) {
	inputs := []string{
		"",
		"plain",
		"<think>a</think>b",
		"<think>\nreason\n</think>\n\nanswer",
		"a<think>b",
		"a<think>b</thi",
		"a<thi",
		"<",
		"<<think>>x</think></think>",
		"<think><think>nested</think>after</think>",
		"</think>stray",
		"x<think></think>y<think>z</think>w",
		"<thin<think>k>", "<thi<think>x</think>nk>",
		"emoji 😀<think>мысль 🤔</think>ответ",
		"a < b and c <= d <t <th",
	}
	for _, in := range inputs {
		wc, wr := refSplit(in)
		// Every split of the input into two and three pieces.
		for i := 0; i <= len(in); i++ {
			if c, r := splitPieces([]string{in[:i], in[i:]}); c != wc || r != wr {
				t.Fatalf("%q split at %d: got (%q,%q) want (%q,%q)", in, i, c, r, wc, wr)
			}
			for j := i; j <= len(in); j++ {
				if c, r := splitPieces([]string{in[:i], in[i:j], in[j:]}); c != wc || r != wr {
					t.Fatalf("%q split at %d,%d: got (%q,%q)", in, i, j, c, r)
				}
			}
		}
		// Byte by byte.
		var pieces []string
		for i := 0; i < len(in); i++ {
			pieces = append(pieces, in[i:i+1])
		}
		if c, r := splitPieces(pieces); c != wc || r != wr {
			t.Fatalf("%q bytewise: got (%q,%q)", in, c, r)
		}
	}
}

func TestSplitterHoldsOnlyTagPrefixes(t *testing.T) {
	var s splitter
	c, r, _ := s.feed([]byte("abc<th"), nil, nil, nil)
	if string(c) != "abc" || len(r) != 0 || string(s.held[:s.nheld]) != "<th" {
		t.Fatalf("c=%q held=%q", c, s.held[:s.nheld])
	}
	c, _, _ = s.feed([]byte("x"), c[:0], nil, nil)
	if string(c) != "<thx" || s.nheld != 0 {
		t.Fatalf("c=%q held=%q", c, s.held[:s.nheld])
	}
	// "<x" is resolved at once: nothing held.
	c, _, _ = s.feed([]byte("a<x"), c[:0], nil, nil)
	if string(c) != "a<x" || s.nheld != 0 {
		t.Fatalf("c=%q", c)
	}
	// Inside a block only a "</think>" prefix is held.
	s = splitter{inThink: true}
	_, r, _ = s.feed([]byte("r<think"), nil, nil, nil)
	if string(r) != "r<think" || s.nheld != 0 {
		t.Fatalf("r=%q held=%q", r, s.held[:s.nheld])
	}
	_, r, _ = s.feed([]byte("</think"), r[:0], nil, nil)
	if len(r) != 0 || string(s.held[:s.nheld]) != "</think" {
		t.Fatalf("r=%q held=%q", r, s.held[:s.nheld])
	}
}

func TestRewriteCompletion(t *testing.T) {
	cases := []struct {
		name, body string
		mode       ThinkMode
		want       string // "" = unchanged
	}{
		{"split", `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"<think>\nhmm\n</think>\n\nHi"},"finish_reason":"stop"}],"usage":{"total_tokens":9}}`, ThinkSplit,
			`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"\n\nHi","reasoning_content":"\nhmm\n"},"finish_reason":"stop"}],"usage":{"total_tokens":9}}`},
		{"strip", `{"choices":[{"message":{"content":"<think>hmm</think>Hi","role":"assistant"}}]}`, ThinkStrip,
			`{"choices":[{"message":{"content":"Hi","role":"assistant"}}]}`},
		{"strip keeps existing reasoning", `{"choices":[{"message":{"content":"<think>hmm</think>Hi","reasoning_content":"native"}}]}`, ThinkStrip,
			`{"choices":[{"message":{"content":"Hi","reasoning_content":"native"}}]}`},
		{"existing reasoning appended", `{"choices":[{"message":{"reasoning_content":"native. ","content":"<think>more</think>Hi"}}]}`, ThinkSplit,
			`{"choices":[{"message":{"reasoning_content":"native. more","content":"Hi"}}]}`},
		{"null reasoning replaced", `{"choices":[{"message":{"content":"<think>r</think>Hi","reasoning_content":null}}]}`, ThinkSplit,
			`{"choices":[{"message":{"content":"Hi","reasoning_content":"r"}}]}`},
		{"several blocks", `{"choices":[{"message":{"content":"<think>a</think>x<think>b</think>y"}}]}`, ThinkSplit,
			`{"choices":[{"message":{"content":"xy","reasoning_content":"ab"}}]}`},
		{"unclosed", `{"choices":[{"message":{"content":"x<think>tail</th"}}]}`, ThinkSplit,
			`{"choices":[{"message":{"content":"x","reasoning_content":"tail</th"}}]}`},
		{"held non-tag at end is content", `{"choices":[{"message":{"content":"<think>a</think>b<thi"}}]}`, ThinkSplit,
			`{"choices":[{"message":{"content":"b<thi","reasoning_content":"a"}}]}`},
		{"escaped tags", `{"choices":[{"message":{"content":"\u003cthink\u003e\u00e9\"\u003c/think\u003e\u003cb\u003e\ud83d\ude00"}}]}`, ThinkSplit,
			`{"choices":[{"message":{"content":"<b>😀","reasoning_content":"é\""}}]}`},
		{"multiple choices", `{"choices":[{"index":0,"message":{"content":"a"}},{"index":1,"message":{"content":"<think>r</think>b"}},{"index":2,"message":{"content":"<think>s</think>"}}]}`, ThinkSplit,
			`{"choices":[{"index":0,"message":{"content":"a"}},{"index":1,"message":{"content":"b","reasoning_content":"r"}},{"index":2,"message":{"content":"","reasoning_content":"s"}}]}`},
		{"pretty printed", "{\n \"choices\": [\n  {\n   \"message\": {\n    \"content\": \"<think>r</think>b\"\n   }\n  }\n ]\n}\n", ThinkSplit,
			"{\n \"choices\": [\n  {\n   \"message\": {\n    \"content\": \"b\",\"reasoning_content\":\"r\"\n   }\n  }\n ]\n}\n"},
		{"multimodal untouched", `{"choices":[{"message":{"content":[{"type":"text","text":"<think>x</think>"}]}}]}`, ThinkSplit, ""},
		{"no tags", `{"choices":[{"message":{"content":"a < b"}}]}`, ThinkSplit, ""},
		{"stray close", `{"choices":[{"message":{"content":"a</think>b"}}]}`, ThinkSplit, ""},
		{"off", `{"choices":[{"message":{"content":"<think>x</think>"}}]}`, ThinkOff, ""},
		{"error body", `{"error":{"message":"<think>"},"choices":[{"message":{"content":"<think>x</think>"}}]}`, ThinkSplit, ""},
		{"invalid JSON", `{"choices":[{"message":{"content":"<think>x</think>"}}]`, ThinkSplit, ""},
		{"not an object", `["<think>x</think>"]`, ThinkSplit, ""},
		{"trailing garbage", `{"choices":[{"message":{"content":"<think>x</think>"}}]}x`, ThinkSplit, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			out, changed := RewriteCompletion([]byte("pre"), body, c.mode)
			if c.want == "" {
				if changed || &out[0] != &body[0] || len(out) != len(body) {
					t.Fatalf("changed=%v out=%s", changed, out)
				}
				return
			}
			if !changed || string(out) != "pre"+c.want {
				t.Fatalf("changed=%v\ngot  %s\nwant pre%s", changed, out, c.want)
			}
			if !json.Valid(out[3:]) {
				t.Fatal("invalid JSON")
			}
		})
	}
}

func TestRewriteCompletionInvalidUTF8(t *testing.T) {
	body := []byte("{\"choices\":[{\"message\":{\"content\":\"<think>\xff</think>ok\xc3\"}}]}")
	out, changed := RewriteCompletion(nil, body, ThinkSplit)
	if !changed || !json.Valid(out) || !bytes.Contains(out, []byte(`\ufffd`)) {
		t.Fatalf("%v %q", changed, out)
	}
	var v struct {
		Choices []struct {
			Message struct{ Content, ReasoningContent string } `json:"message"`
		}
	}
	json.Unmarshal(out, &v)
	if strings.ContainsRune(v.Choices[0].Message.Content, 0xff) {
		t.Fatal("invalid UTF-8 survived")
	}
}
