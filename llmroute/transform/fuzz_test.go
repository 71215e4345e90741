package transform

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Fuzz targets. Each has seeds in code and a corpus under testdata/fuzz/<Name>.
// Run one with e.g.  go test -run XXX -fuzz FuzzThinkSplit ./llmroute/transform/

// encodeContent JSON-encodes s independently of the code under test, with or
// without HTML escaping (json.Marshal turns '<' into \u003c, as some
// providers do).
func encodeContent(s string, html bool) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(html)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// buildStream makes a provider-shaped SSE stream whose delta.content pieces
// are content cut at the fuzz-chosen offsets (moved to rune boundaries).
func buildStream(content string, cuts []byte, opts byte) ([]byte, []string) {
	var pieces []string
	rest := content
	for _, c := range cuts {
		if rest == "" {
			break
		}
		n := int(c) % (len(rest) + 1)
		for n < len(rest) && !utf8.RuneStart(rest[n]) {
			n++
		}
		pieces = append(pieces, rest[:n])
		rest = rest[n:]
	}
	pieces = append(pieces, rest)

	nl := "\n"
	if opts&1 != 0 {
		nl = "\r\n"
	}
	html := opts&2 != 0
	var b strings.Builder
	for i, p := range pieces {
		if opts&4 != 0 && i%2 == 1 {
			b.WriteString(": keepalive" + nl + nl)
		}
		role := ""
		if i == 0 {
			role = `"role":"assistant",`
		}
		b.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1751000000,"model":"m","choices":[{"index":0,"delta":{` +
			role + `"content":` + encodeContent(p, html) + `},"finish_reason":null}]}` + nl + nl)
	}
	b.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1751000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"total_tokens":3}}` + nl + nl)
	if opts&16 != 0 {
		// MiniMax-style closing frame repeating the whole text.
		b.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":` +
			encodeContent(content, html) + `},"finish_reason":"stop"}]}` + nl + nl)
	}
	if opts&8 == 0 {
		b.WriteString("data: [DONE]" + nl + nl)
	}
	return []byte(b.String()), pieces
}

// sizesFrom turns fuzz bytes into write sizes (1..256).
func sizesFrom(b []byte) []int {
	if len(b) == 0 {
		return nil
	}
	s := make([]int, len(b))
	for i, c := range b {
		s[i] = int(c) + 1
	}
	return s
}

// tagsWellFormed reports whether the only '<' in s belong to "<think>" and
// "</think>" tags that alternate open, close, open, … from the start.
func tagsWellFormed(s string) (ok bool, tagBytes int) {
	open := false
	for {
		i := strings.IndexByte(s, '<')
		if i < 0 {
			return true, tagBytes
		}
		s = s[i:]
		switch {
		case !open && strings.HasPrefix(s, openTag):
			s, tagBytes = s[len(openTag):], tagBytes+len(openTag)
		case open && strings.HasPrefix(s, closeTag):
			s, tagBytes = s[len(closeTag):], tagBytes+len(closeTag)
		default:
			return false, 0
		}
		open = !open
	}
}

// FuzzThinkSplit checks the stream splitter end to end on a real SSE stream
// built from arbitrary content cut at arbitrary offsets and written in
// arbitrary pieces.
//
// Properties:
//   - every event out is valid SSE and every data payload is [DONE] or valid
//     JSON;
//   - split: the concatenated delta.content and delta.reasoning_content equal
//     refSplit of the whole input (so nothing is lost, duplicated or
//     reordered, and a tag split at any offset is recognised);
//   - strip: the same content, and no reasoning at all;
//   - the output bytes do not depend on how the input was cut into writes;
//   - for inputs whose only '<' are well-formed alternating tags, neither
//     output contains any '<' (no tag or fragment of one leaks), and
//     len(content)+len(reasoning) == len(input) - tag bytes.
//
// Inputs with literal tags in odd places (nested, stray "</think>", "<thi"
// text) are covered by the refSplit equality, whose semantics the splitter
// documents.
func FuzzThinkSplit(f *testing.F) {
	f.Add("<think>\nreasoning\n</think>\n\nanswer", []byte{3, 9, 1}, []byte{7}, byte(0))
	f.Add("a<think>b</think>c<think>d", []byte{1, 1, 1, 1, 1, 1, 1, 1, 1}, []byte{0}, byte(1))
	f.Add("<<think>></think><", []byte{2, 5}, []byte{}, byte(2))
	f.Add("мысль<think>🤔 думаю</think>ответ <b>", []byte{4, 4, 4}, []byte{1, 2}, byte(7))
	f.Add("x</think>y<thi", []byte{}, []byte{3}, byte(8))
	f.Add("<think></think><think>", []byte{7, 8}, []byte{30}, byte(15))
	f.Add("<think>r</think>c<", []byte{2, 9}, []byte{11}, byte(16|2))
	f.Fuzz(func(t *testing.T, content string, cuts, writes []byte, opts byte) {
		if len(content) > 4096 {
			content = content[:4096] // keep executions fast
		}
		content = strings.ToValidUTF8(content, "?")
		in, _ := buildStream(content, cuts, opts)
		wantC, wantR := refSplit(content)
		sizes := sizesFrom(writes)
		var splitContent string
		for _, mode := range []ThinkMode{ThinkSplit, ThinkStrip} {
			out := pipe(t, mode, in, sizes)
			if mode == ThinkSplit {
				if whole := pipe(t, mode, in, nil); !bytes.Equal(whole, out) {
					t.Fatalf("%v: output depends on write sizes", mode)
				}
			}
			// collectStream fails on any data payload that isn't valid JSON.
			st := collectStream(t, out)
			if st.content[0] != wantC {
				t.Fatalf("%v content %q want %q", mode, st.content[0], wantC)
			}
			switch mode {
			case ThinkSplit:
				splitContent = st.content[0]
				if st.reasoning[0] != wantR {
					t.Fatalf("reasoning %q want %q", st.reasoning[0], wantR)
				}
				if opts&16 != 0 && (st.msgContent[0] != wantC || st.msgReasoning[0] != wantR) {
					t.Fatalf("whole message frame: %q / %q", st.msgContent[0], st.msgReasoning[0])
				}
				if ok, tagBytes := tagsWellFormed(content); ok {
					if strings.Contains(st.content[0], "<") || strings.Contains(st.reasoning[0], "<") {
						t.Fatalf("tag fragment leaked: %q / %q", st.content[0], st.reasoning[0])
					}
					if len(st.content[0])+len(st.reasoning[0]) != len(content)-tagBytes {
						t.Fatal("bytes lost or invented")
					}
				}
			case ThinkStrip:
				if st.content[0] != splitContent || st.reasoning[0] != "" {
					t.Fatalf("strip: %q / %q", st.content[0], st.reasoning[0])
				}
				if opts&16 != 0 && (st.msgContent[0] != wantC || st.msgReasoning[0] != "") {
					t.Fatalf("strip whole message frame: %q / %q", st.msgContent[0], st.msgReasoning[0])
				}
			}
		}
	})
}

// sanitizeNoTags removes everything that could decode to '<' so no think tag
// (or prefix of one) can appear in a decoded content string.
func sanitizeNoTags(b []byte) []byte {
	b = bytes.ReplaceAll(b, []byte("<"), []byte("["))
	for i := 0; i+5 <= len(b); i++ {
		if (b[i] == 'u' || b[i] == 'U') && string(b[i+1:i+4]) == "003" && (b[i+4] == 'c' || b[i+4] == 'C') {
			b[i+4] = 'd'
		}
	}
	return b
}

// FuzzStreamRewriterFraming feeds arbitrary bytes in arbitrary pieces, with a
// small event limit so the oversized path is exercised. Properties: no panic;
// the carried buffer never exceeds the limit; and in split mode, for input in
// which nothing can decode to '<' (sanitised), the output equals the input
// byte for byte once Close is called.
func FuzzStreamRewriterFraming(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"<think>x\"}}]}\r\n\r\n: ka\r\rdata: [DONE]\n\n"), []byte{3, 1}, byte(0), uint16(0))
	f.Add([]byte("data: {\"a\":\ndata: 1}\nevent: x\nid: 3\nretry: 5\n\n\n\ndata\n\n:\n\r\n"), []byte{1}, byte(1), uint16(20))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"\\u003cthink\\u003ea\"}}]}\r"), []byte{}, byte(2), uint16(40))
	f.Add([]byte(strings.Repeat("data: xxxxxxxxxxxxxxxx\n", 20)+"\n"), []byte{5, 7}, byte(0), uint16(16))
	f.Fuzz(func(t *testing.T, data, writes []byte, mode byte, limit uint16) {
		sizes := sizesFrom(writes)
		run := func(m ThinkMode, in []byte) []byte {
			var out []byte
			s := NewStreamRewriter(m, func(ev []byte) error { out = append(out, ev...); return nil })
			if limit != 0 {
				s.max = 16 + int(limit)%1024
			}
			for k := 0; len(in) > 0; k++ {
				n := len(in)
				if len(sizes) > 0 {
					n = min(sizes[k%len(sizes)], len(in))
				}
				if _, err := s.Write(in[:n]); err != nil {
					t.Fatal(err)
				}
				if len(s.buf) > s.max {
					t.Fatalf("buffered %d bytes > limit %d", len(s.buf), s.max)
				}
				in = in[n:]
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return out
		}
		run(ThinkMode(mode%3), data)
		clean := sanitizeNoTags(bytes.Clone(data))
		if out := run(ThinkSplit, clean); !bytes.Equal(out, clean) {
			t.Fatalf("tag-free stream changed:\nin  %q\nout %q", clean, out)
		}
	})
}

// FuzzPatch checks raw patching against the map-merge reference: for an
// arbitrary JSON object body and two patches, sequential application equals
// Then, equals the reference after normalisation, and is valid JSON. It also
// checks the strict validator against json.Valid.
func FuzzPatch(f *testing.F) {
	f.Add([]byte(`{"a":{"b":1},"c":[1,2]}`), []byte(`{"a":1}`), []byte(`{"a":{"x":{"y":2}}}`))
	f.Add([]byte(`{"mod\u0065l":"x","a":{"b":{"c":null}}}`), []byte(`{"model":{"z":1},"a":{"b":{"d":[]}}}`), []byte(`{"a":{"b":"s"}}`))
	f.Add([]byte(" {\n \"a\" : { } , \"a\":[] }\n"), []byte(`{"a":{"k":true}}`), []byte(`{"b":-1.5e3}`))
	f.Add([]byte(`{}`), []byte(`{"p":{"q":{}}}`), []byte(`{"p":{"q":{"r":"\u00e9"}}}`))
	f.Fuzz(func(t *testing.T, body, p1raw, p2raw []byte) {
		if got, want := jsonscan.Valid(body), json.Valid(body); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid = %v", body, got, want)
		}
		p1, err1 := CompilePatch(p1raw)
		p2, err2 := CompilePatch(p2raw)
		if err1 != nil || err2 != nil {
			return
		}
		i := jsonscan.SkipWS(body, 0)
		if !jsonscan.Valid(body) || i >= len(body) || body[i] != '{' {
			return
		}
		step, err := p1.Apply(nil, body)
		if err != nil {
			t.Fatalf("Apply p1: %v", err)
		}
		seq, err := p2.Apply(nil, step)
		if err != nil {
			t.Fatalf("Apply p2: %v", err)
		}
		one, err := p1.Then(p2).Apply(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(seq, one) {
			t.Fatalf("Then differs from sequential:\nseq  %s\nThen %s", seq, one)
		}
		if !json.Valid(one) {
			t.Fatalf("invalid output %s", one)
		}
		// encoding/json replaces invalid UTF-8 in keys, which raw key
		// comparison doesn't: compare with the reference on valid UTF-8 only.
		if !utf8.Valid(body) || !utf8.Valid(p1raw) || !utf8.Valid(p2raw) {
			return
		}
		ref, err := decodeAny(body)
		if err != nil {
			return // e.g. numbers encoding/json rejects
		}
		for _, p := range [][]byte{p1raw, p2raw} {
			if len(bytes.TrimSpace(p)) == 0 || string(bytes.TrimSpace(p)) == "null" {
				continue
			}
			pv, err := decodeAny(p)
			if err != nil {
				return
			}
			refMerge(ref.(map[string]any), pv.(map[string]any))
		}
		if got, want := normJSON(t, one), string(mustJSON(ref)); got != want {
			t.Fatalf("reference mismatch\nbody %s\np1 %s\np2 %s\ngot  %s\nwant %s", body, p1raw, p2raw, got, want)
		}
	})
}

// refRewrite is the map-based reference for RewriteRequest.
func refRewrite(body []byte, e *RequestEdit, patch []byte) (any, error) {
	v, err := decodeAny(body)
	if err != nil {
		return nil, err
	}
	m := v.(map[string]any)
	if e.Model != "" {
		m["model"] = e.Model
	}
	if len(patch) > 0 {
		pv, _ := decodeAny(patch)
		refMerge(m, pv.(map[string]any))
	}
	if e.ReasoningField == "" {
		return m, nil
	}
	msgs, _ := m["messages"].([]any)
	for _, x := range msgs {
		msg, ok := x.(map[string]any)
		if !ok || msg["role"] != "assistant" {
			continue
		}
		cur, has := msg[e.ReasoningField]
		if s, ok := cur.(string); ok && s != "" {
			continue
		}
		text := ""
		if r, ok := msg["reasoning"].(string); ok && r != "" && e.ReasoningField != "reasoning" {
			text = r
		} else if det, ok := msg["reasoning_details"].([]any); ok && e.ReasoningField != "reasoning_details" {
			var parts []string
			for _, d := range det {
				dm, ok := d.(map[string]any)
				if !ok {
					continue
				}
				tx, ok := dm["text"].(string)
				if !ok {
					continue
				}
				if ty, has := dm["type"]; has && ty != nil && ty != "reasoning.text" {
					continue
				}
				parts = append(parts, tx)
			}
			text = strings.Join(parts, "\n")
		}
		if text == "" {
			if !e.ReasoningEmptyOK {
				continue
			}
			if s, ok := cur.(string); ok && has && s == "" {
				continue
			}
		}
		msg[e.ReasoningField] = text
	}
	return m, nil
}

// FuzzRewriteRequest: arbitrary bodies never panic; when ParseRequest
// accepts one, the output is valid JSON with the model replaced, and equals
// the map-based reference (model swap, patch, backfill) after normalisation.
func FuzzRewriteRequest(f *testing.F) {
	f.Add([]byte(`{"model":"a","messages":[{"role":"assistant","reasoning":"r"}]}`), "gpt-4o", byte(3))
	f.Add([]byte(`{"model":"a","messages":[{"role":"assistant","reasoning_details":[{"text":"x"},{"type":"reasoning.text","text":"y"}],"reasoning_content":""}]}`), "m\"", byte(1))
	f.Add([]byte(`{"stream":true,"model":"x","provider":{"only":["a"]},"messages":[]}`), "", byte(4))
	f.Add([]byte(`{"model":1}`), "x", byte(0))
	f.Add([]byte(`{"messages":[{"role":"assistant"}],"model":"m","model":"n"}`), "é", byte(7))
	patches := []string{"", `{"provider":{"ignore":["deepseek"]},"reasoning":{"enabled":false}}`, `{"messages":[{"role":"assistant","reasoning":"p"}]}`, `{"model":"patched","temperature":0}`}
	f.Fuzz(func(t *testing.T, body []byte, model string, opts byte) {
		patchRaw := patches[int(opts>>2)%len(patches)]
		e := &RequestEdit{Model: model, Patch: mustPatch(t, patchRaw)}
		if opts&1 != 0 {
			e.ReasoningField = "reasoning_content"
		}
		e.ReasoningEmptyOK = opts&2 != 0
		_, _, perr := ParseRequest(body)
		out, err := RewriteRequest(nil, body, e) // must not panic either way
		if perr == ErrBadJSON || perr == ErrDuplicateKey {
			return
		}
		if err != nil {
			t.Fatalf("RewriteRequest: %v", err)
		}
		if !json.Valid(out) {
			t.Fatalf("invalid output %q", out)
		}
		got, _, perr2 := ParseRequest(out)
		wantModel := model
		if strings.Contains(patchRaw, `"model"`) {
			wantModel = "patched"
		}
		var canon string // what encoding/json makes of it (each invalid byte -> U+FFFD)
		json.Unmarshal(mustJSON(wantModel), &canon)
		if wantModel != "" && (perr2 != nil || got != canon) {
			t.Fatalf("model %q (%v), want %q", got, perr2, wantModel)
		}
		if !utf8.Valid(body) || !utf8.ValidString(model) {
			return
		}
		ref, err := refRewrite(body, e, []byte(patchRaw))
		if err != nil {
			return
		}
		if g, w := normJSON(t, out), string(mustJSON(ref)); g != w {
			t.Fatalf("reference mismatch\nbody %s\ngot  %s\nwant %s", body, g, w)
		}
	})
}

// FuzzSessions: never panics, never returns an empty id, and an id is stable
// for a repeated body.
func FuzzSessions(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]}]}`))
	f.Add([]byte(`{"messages":[1,"x",null,{"role":"user"}]}`))
	f.Add([]byte(`{"messages":{}}`))
	s := NewSessions(8, 0, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		id := s.ID(body)
		if len(id) != 32 {
			t.Fatalf("id %q", id)
		}
		if again := s.ID(body); again != id {
			t.Fatalf("unstable id %s then %s", id, again)
		}
	})
}

// FuzzRewriteCompletion: arbitrary bodies never panic; a changed body is
// valid JSON, and an unchanged one is returned as is.
func FuzzRewriteCompletion(f *testing.F) {
	f.Add([]byte(`{"choices":[{"message":{"content":"<think>a</think>b","reasoning_content":"x"}}]}`), byte(1))
	f.Add([]byte(`{"choices":[{"message":{"content":"\u003cthink\u003ea"}},{"message":{"content":[1]}}]}`), byte(2))
	f.Fuzz(func(t *testing.T, body []byte, mode byte) {
		out, changed := RewriteCompletion(nil, body, ThinkMode(mode%3))
		if !changed {
			if len(out) != len(body) || (len(body) > 0 && &out[0] != &body[0]) {
				t.Fatal("unchanged body not returned as is")
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid output %q", out)
		}
	})
}

// FuzzParseRequestKeys: duplicates of model, stream, messages and of the
// watched keys are reported exactly as a reference that walks the top-level
// object with encoding/json's tokenizer finds them.
func FuzzParseRequestKeys(f *testing.F) {
	f.Add([]byte(`{"model":"m","temperature":1,"temperature":2}`))
	f.Add([]byte(`{"model":"m","mod\u0065l":"n"}`))
	f.Add([]byte(`{"model":"m","stream":true,"x":{"stream":1},"stream":false}`))
	f.Add([]byte(`{"messages":[],"model":"m","top_p":1,"messages":{}}`))
	watch := []string{"temperature", "top_p", "provider"}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _, dups, err := ParseRequestKeys(body, watch, nil)
		if err == ErrBadJSON || !utf8.Valid(body) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		if tok, e := dec.Token(); e != nil || tok != json.Delim('{') {
			return
		}
		count := map[string]int{}
		for dec.More() {
			tok, e := dec.Token()
			if e != nil {
				return
			}
			count[tok.(string)]++
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return
			}
		}
		wantDup := count["model"] > 1 || count["stream"] > 1 || count["messages"] > 1
		if (err == ErrDuplicateKey) != wantDup {
			t.Fatalf("%s: err %v, counts %v", body, err, count)
		}
		var want uint64
		for i, k := range watch {
			if count[k] > 1 {
				want |= 1 << i
			}
		}
		if dups != want {
			t.Fatalf("%s: dups %b, want %b", body, dups, want)
		}
	})
}
