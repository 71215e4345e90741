package transform

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func chunkEv(id string, delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":%q,"created":5,"model":"m-%s","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", id, id, delta, f)
}

// feedSplit writes s to c in pieces of n bytes.
func feedSplit(t *testing.T, c *ChatResume, s string, n int) error {
	t.Helper()
	for i := 0; i < len(s); i += n {
		if _, err := c.Write([]byte(s[i:min(i+n, len(s))])); err != nil {
			return err
		}
	}
	return nil
}

// clientText decodes what the follower sent: content, reasoning, roles.
func clientText(t *testing.T, out string) (content, reasoning string, roles int, ids []string) {
	t.Helper()
	for _, ev := range strings.Split(strings.TrimSpace(out), "\n\n") {
		var cr ChatResume
		cr.sc.reset()
		data := eventData([]byte(ev))
		if string(data) == "[DONE]" || len(data) == 0 {
			continue
		}
		cr.note(data)
		if cr.opaque {
			t.Fatalf("client got an event that is not a chat chunk: %q", ev)
		}
		content += string(cr.content)
		reasoning += string(cr.reasoning)
		if cr.roleSent {
			roles++
		}
		ids = append(ids, cr.id+"/"+cr.model+"/"+string(cr.created))
	}
	return
}

// TestChatResumePassThrough: on the first upstream every complete event
// goes on byte for byte, whatever the read boundaries (CRLF framing too);
// an incomplete one is held until it completes or Flush.
func TestChatResumePassThrough(t *testing.T) {
	stream := chunkEv("a", `{"role":"assistant","content":""}`, "") + chunkEv("a", `{"content":"Hel"}`, "") +
		strings.ReplaceAll(chunkEv("a", `{"content":"lo"}`, ""), "\n", "\r\n") + ": comment\n\n" + chunkEv("a", `{"content":" there"}`, "")
	for _, n := range []int{1, 2, 7, 64, len(stream)} {
		var out bytes.Buffer
		c := NewChatResume(&out)
		if err := feedSplit(t, c, stream, n); err != nil {
			t.Fatal(err)
		}
		if out.String() != stream {
			t.Fatalf("split %d: out\n%q\nwant\n%q", n, out.String(), stream)
		}
		if c.Content() != "Hello there" || !c.roleSent {
			t.Fatalf("split %d: content %q role %v", n, c.Content(), c.roleSent)
		}
	}
	var out bytes.Buffer
	c := NewChatResume(&out)
	half := chunkEv("a", `{"content":"x"}`, "")[:20]
	_, _ = c.Write([]byte(chunkEv("a", `{"content":"y"}`, "") + half))
	if out.String() != chunkEv("a", `{"content":"y"}`, "") {
		t.Fatal("half an event went out")
	}
	if c.Content() != "y" {
		t.Fatalf("content %q counts the half event", c.Content())
	}
	_ = c.Flush()
	if out.String() != chunkEv("a", `{"content":"y"}`, "") {
		t.Fatalf("Flush passed half an event on: %q", out.String())
	}

	// An event that only lacks its blank line is whole: Flush passes it.
	out.Reset()
	c = NewChatResume(&out)
	last := strings.TrimSuffix(chunkEv("a", `{"content":"z"}`, "stop"), "\n\n")
	_, _ = c.Write([]byte(last))
	_ = c.Flush()
	if out.String() != last {
		t.Fatalf("Flush did not pass the unterminated event on: %q", out.String())
	}
}

// TestChatResumeReplay: the regenerated text is held back until it matches
// what was delivered, then the rest goes on with the first id; the role
// chunk is dropped.
func TestChatResumeReplay(t *testing.T) {
	var out bytes.Buffer
	c := NewChatResume(&out)
	_ = feedSplit(t, c, chunkEv("a", `{"role":"assistant","content":""}`, "")+chunkEv("a", `{"content":"one two"}`, "")+chunkEv("a", `{"content":" thr"}`, ""), 1000)
	out.Reset()
	c.Continue(false)
	replay := chunkEv("b", `{"role":"assistant","content":""}`, "") + chunkEv("b", `{"content":"one "}`, "") +
		chunkEv("b", `{"content":"two three"}`, "") + chunkEv("b", `{"content":" four"}`, "") + chunkEv("b", `{}`, "stop") + "data: [DONE]\n\n"
	if err := feedSplit(t, c, replay, 5); err != nil {
		t.Fatal(err)
	}
	content, _, roles, ids := clientText(t, out.String())
	if content != "ee four" || roles != 0 {
		t.Fatalf("forwarded %q (roles %d), want %q", content, roles, "ee four")
	}
	for _, id := range ids {
		if id != "a/m-a/5" {
			t.Fatalf("id/model/created %q, want the first's", id)
		}
	}
	if !strings.HasSuffix(out.String(), "data: [DONE]\n\n") || !strings.Contains(out.String(), `"finish_reason":"stop"`) {
		t.Fatalf("end of stream missing: %q", out.String())
	}
}

// TestChatResumeDiverges: text that disagrees, a finish before the seam, or
// a tool call before it: nothing more goes out.
func TestChatResumeDiverges(t *testing.T) {
	first := chunkEv("a", `{"role":"assistant","content":"abc def"}`, "")
	for name, replay := range map[string]string{
		"text":   chunkEv("b", `{"content":"abc xyz and more"}`, ""),
		"finish": chunkEv("b", `{"content":"abc"}`, "") + chunkEv("b", `{}`, "stop"),
		"done":   chunkEv("b", `{"content":"abc"}`, "") + "data: [DONE]\n\n",
		"tool":   chunkEv("b", `{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}`, ""),
		"choice": `data: {"id":"b","choices":[{"index":1,"delta":{"content":"abc def"}}]}` + "\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			c := NewChatResume(&out)
			_ = feedSplit(t, c, first, 1000)
			out.Reset()
			c.Continue(false)
			err := feedSplit(t, c, replay, 1000)
			if !errors.Is(err, ErrDiverged) || !c.Diverged() {
				t.Fatalf("err %v diverged %v", err, c.Diverged())
			}
			if out.Len() != 0 {
				t.Fatalf("sent after divergence: %q", out.String())
			}
			if ok, _ := c.Resumable(); ok {
				t.Fatal("a diverged stream is resumable")
			}
		})
	}
}

// TestChatResumeReasoning: cut during reasoning, the replay's reasoning is
// matched and its rest forwarded, then its content; once content was
// delivered, a regenerated reasoning is left out (prefill and replay).
func TestChatResumeReasoning(t *testing.T) {
	var out bytes.Buffer
	c := NewChatResume(&out)
	_ = feedSplit(t, c, chunkEv("a", `{"role":"assistant","reasoning_content":"let me"}`, ""), 1000)
	out.Reset()
	c.Continue(false)
	_ = feedSplit(t, c, chunkEv("b", `{"role":"assistant","reasoning_content":"let me think"}`, "")+chunkEv("b", `{"content":"42"}`, ""), 1000)
	content, reasoning, _, _ := clientText(t, out.String())
	if reasoning != " think" || content != "42" {
		t.Fatalf("forwarded reasoning %q content %q", reasoning, content)
	}

	for _, prefill := range []bool{true, false} {
		out.Reset()
		c := NewChatResume(&out)
		_ = feedSplit(t, c, chunkEv("a", `{"role":"assistant","reasoning_content":"hmm"}`, "")+chunkEv("a", `{"content":"The an"}`, ""), 1000)
		out.Reset()
		c.Continue(prefill)
		next := chunkEv("b", `{"reasoning_content":"other thoughts"}`, "") + chunkEv("b", `{"content":"The answer"}`, "")
		if prefill {
			next = chunkEv("b", `{"reasoning_content":"other thoughts"}`, "") + chunkEv("b", `{"content":"swer"}`, "")
		}
		if err := feedSplit(t, c, next, 3); err != nil {
			t.Fatalf("prefill %v: %v", prefill, err)
		}
		content, reasoning, _, _ := clientText(t, out.String())
		if reasoning != "" || content != "swer" || c.Content() != "The answer" {
			t.Fatalf("prefill %v: forwarded reasoning %q content %q (total %q)", prefill, reasoning, content, c.Content())
		}
	}
}

// TestChatResumeNotResumable: tool calls, a second choice, a finished
// answer.
func TestChatResumeNotResumable(t *testing.T) {
	for why, stream := range map[string]string{
		"tool_call":       chunkEv("a", `{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}`, ""),
		"several_choices": `data: {"id":"a","choices":[{"index":1,"delta":{"content":"x"}}]}` + "\n\n",
		"finished":        chunkEv("a", `{}`, "stop"),
		"unparsed_stream": "data: {not json\n\n",
	} {
		c := NewChatResume(&bytes.Buffer{})
		_ = feedSplit(t, c, stream, 1000)
		if ok, got := c.Resumable(); ok || got != why {
			t.Errorf("%s: resumable %v, %q", why, ok, got)
		}
	}
	c := NewChatResume(&bytes.Buffer{})
	_ = feedSplit(t, c, chunkEv("a", `{"content":"x","tool_calls":null}`, ""), 1000)
	if ok, why := c.Resumable(); !ok {
		t.Errorf("tool_calls null counted as a tool call: %s", why)
	}
}

// FuzzChatResumePassThrough: on the first upstream, whatever the bytes and
// read boundaries, Write then Flush give the input back exactly, and a
// continuation never panics.
func FuzzChatResumePassThrough(f *testing.F) {
	f.Add([]byte(chunkEv("a", `{"role":"assistant","content":"hi"}`, "")+"data: [DONE]\n\n"), uint8(3))
	f.Add([]byte("data: x\r\rdata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":1}}]}\n\n"), uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, split uint8) {
		n := int(split)%17 + 1
		var out bytes.Buffer
		c := NewChatResume(&out)
		for i := 0; i < len(b); i += n {
			if _, err := c.Write(b[i:min(i+n, len(b))]); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), b) {
			t.Fatalf("out %q, want %q", out.Bytes(), b)
		}
		c.Continue(split%2 == 0)
		for i := 0; i < len(b); i += n {
			if _, err := c.Write(b[i:min(i+n, len(b))]); err != nil {
				break
			}
		}
		_ = c.Flush()
	})
}
