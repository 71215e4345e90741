package gemini

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A chat stream that ends with neither a finish_reason nor [DONE] was cut:
// Close says so and emits nothing final (no finishReason, no calls the
// upstream did not finish); Fail then ends it with Google's error event. A
// finish_reason without [DONE] is a whole answer.
func TestStreamUnfinished(t *testing.T) {
	feed := func(up string) (*Stream, *bytes.Buffer, error) {
		var out bytes.Buffer
		s := NewStream(&Info{Model: "asked"}, func(ev []byte) error { checkEvent(t, ev); out.Write(ev); return nil })
		for _, p := range bytewise(up) {
			if _, err := s.Write([]byte(p)); err != nil {
				t.Fatal(err)
			}
		}
		return s, &out, s.Close()
	}
	t.Run("cut", func(t *testing.T) {
		up := sse(`{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":"half a "},"finish_reason":null}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}`) +
			`data: {"id":"x","choices":[{"index":0,"delta":{"content":"sen`
		s, out, err := feed(up)
		if !errors.Is(err, ErrUnfinished) || s.Finished() {
			t.Fatalf("Close = %v, Finished %v; want ErrUnfinished, not finished", err, s.Finished())
		}
		for _, bad := range []string{"finishReason", "functionCall", "usageMetadata"} {
			if strings.Contains(out.String(), bad) {
				t.Errorf("%q emitted for a cut stream:\n%s", bad, out)
			}
		}
		out.Reset()
		if err := s.Fail("stream_interrupted", "the upstream stream was interrupted before it finished"); err != nil {
			t.Fatal(err)
		}
		want := "data: {\"error\":{\"code\":503,\"message\":\"the upstream stream was interrupted before it finished\",\"status\":\"UNAVAILABLE\",\"details\":[{\"@type\":\"type.googleapis.com/google.rpc.ErrorInfo\",\"reason\":\"stream_interrupted\",\"domain\":\"llm_route\"}]}}\r\n\r\n"
		if out.String() != want || !s.Finished() {
			t.Errorf("Fail emitted %q (finished %v), want %q", out, s.Finished(), want)
		}
	})
	t.Run("empty", func(t *testing.T) {
		_, out, err := feed("")
		if !errors.Is(err, ErrUnfinished) || out.Len() != 0 {
			t.Fatalf("Close = %v, emitted %q; want ErrUnfinished and nothing", err, out)
		}
	})
	t.Run("finish reason without [DONE]", func(t *testing.T) {
		up := sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"whole"},"finish_reason":null}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`)
		s, out, err := feed(up)
		if err != nil || !s.Finished() {
			t.Fatalf("Close = %v, Finished %v", err, s.Finished())
		}
		if !strings.HasSuffix(out.String(), `"finishReason":"MAX_TOKENS","index":0}],"modelVersion":"asked","responseId":"x"}`+"\r\n\r\n") {
			t.Errorf("got:\n%s", out)
		}
	})
	t.Run("empty finish reason", func(t *testing.T) {
		up := sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":""}]}`)
		if _, _, err := feed(up); !errors.Is(err, ErrUnfinished) {
			t.Fatalf("Close = %v, want ErrUnfinished (an empty finish_reason gives no reason)", err)
		}
	})
}
