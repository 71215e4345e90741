package responses

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A chat stream that ends with neither a finish_reason nor [DONE] was cut:
// Close says so and emits no response.completed; Fail then ends it with
// response.failed. A finish_reason without [DONE] is a whole response.
func TestStreamUnfinished(t *testing.T) {
	feed := func(up string) (*Stream, *bytes.Buffer, error) {
		var out bytes.Buffer
		s := NewStream(infoFor(t, `{"model":"m","input":"x"}`), func(ev []byte) error { out.Write(ev); return nil })
		for i := 0; i < len(up); i++ {
			if _, err := s.Write([]byte{up[i]}); err != nil {
				t.Fatal(err)
			}
		}
		return s, &out, s.Close()
	}
	t.Run("cut", func(t *testing.T) {
		up := chatChunk(`{"role":"assistant","content":"half a "}`, "") + `data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"sen`
		s, out, err := feed(up)
		if !errors.Is(err, ErrUnfinished) || s.Finished() {
			t.Fatalf("Close = %v, Finished %v; want ErrUnfinished, not finished", err, s.Finished())
		}
		for _, bad := range []string{"response.completed", "response.incomplete", "response.output_item.done", "response.output_text.done"} {
			if strings.Contains(out.String(), bad) {
				t.Errorf("%s emitted for a cut stream:\n%s", bad, out)
			}
		}
		if !strings.Contains(out.String(), `"delta":"half a "`) {
			t.Errorf("the delivered text is missing:\n%s", out)
		}
		n := len(parseEvents(t, out.Bytes()))
		if err := s.Fail("stream_interrupted", "cut"); err != nil {
			t.Fatal(err)
		}
		evs := parseEvents(t, out.Bytes())
		if len(evs) != n+1 || evs[n].name != "response.failed" || !s.Finished() {
			t.Fatalf("Fail emitted %v", names(evs[n:]))
		}
		r := evs[n].data["response"].(map[string]any)
		if e, _ := r["error"].(map[string]any); r["status"] != "failed" || e["code"] != "stream_interrupted" {
			t.Errorf("failed response %v", r)
		}
	})
	t.Run("finish reason without [DONE]", func(t *testing.T) {
		up := chatChunk(`{"content":"whole"}`, "") + chatChunk(`{}`, "stop")
		s, out, err := feed(up)
		if err != nil || !s.Finished() {
			t.Fatalf("Close = %v, Finished %v", err, s.Finished())
		}
		evs := parseEvents(t, out.Bytes())
		if last := evs[len(evs)-1]; last.name != "response.completed" {
			t.Errorf("last event %s", last.name)
		}
	})
	t.Run("[DONE] without finish reason", func(t *testing.T) {
		s, out, err := feed(chatChunk(`{"content":"whole"}`, "") + "data: [DONE]\n\n")
		if err != nil || !s.Finished() || !strings.Contains(out.String(), "response.completed") {
			t.Fatalf("Close = %v, Finished %v:\n%s", err, s.Finished(), out)
		}
	})
}
