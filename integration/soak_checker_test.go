package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestSoakCheckerContinuedStreams proves the fault soak's checker: for a
// model with resume on it accepts a stream continued elsewhere exactly when
// it reads as the one answer, and flags every mix or loss; for a model
// without resume only the upstream's own bytes pass.
func TestSoakCheckerContinuedStreams(t *testing.T) {
	const id = 42
	full := soakEvents("d1", id, false, false, nil, "")
	// The first upstream's role chunk and four words, then d2 continues:
	// its chunks re-encoded (as the proxy's follower does) and stamped
	// with d1's identity.
	first := full[:5]
	delivered := ""
	for _, ev := range first {
		delivered += soakDeltaContent(t, ev)
	}
	stamp := func(ev, up string) string {
		if !strings.HasPrefix(ev, "data: {") {
			return ev
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(ev, "data: "), "\n\n")), &m); err != nil {
			t.Fatal(err)
		}
		m["id"], m["created"], m["model"] = soakChunkID(up, id), soakCreated(up), up
		b, _ := json.Marshal(m)
		return "data: " + string(b) + "\n\n"
	}
	cont := func(prefill, as string) []string {
		var out []string
		for _, ev := range soakEvents("d2", id, false, false, nil, prefill)[1:] { // no role chunk
			out = append(out, stamp(ev, as))
		}
		return out
	}
	join := func(parts ...[]string) string {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(strings.Join(p, ""))
		}
		return b.String()
	}
	errEvent := `data: {"error":{"message":"the upstream stream broke off","type":"upstream_error","code":"stream_interrupted"}}` + "\n\n"
	rest := cont(delivered, "d1")
	noFinish := append(append([]string(nil), rest[:len(rest)-2]...), rest[len(rest)-1])
	secondRole := append([]string{stamp(full[0], "d1")}, rest...)
	lossy := append(append([]string(nil), rest[:1]...), rest[2:]...)

	for _, c := range []struct {
		name     string
		body     string
		complete bool
		resume   bool
		want     string // class, or "bad"
	}{
		{"continued, whole", join(first, rest), true, true, "stream_resumed"},
		{"continued with a heartbeat", join(first, []string{faultKeepalive}, rest), true, true, "stream_resumed"},
		{"the first upstream's own stream", join(full), true, true, "stream_ok"},
		{"continued, cut again", join(first, rest[:2], []string{errEvent}), false, true, "stream_error_resumed:stream_interrupted"},
		{"continued on a model without resume", join(first, rest), true, false, "bad"},
		{"replay not held back: text twice", join(first, cont("", "d1")), true, true, "bad"},
		{"a piece lost", join(first, lossy), true, true, "bad"},
		{"prefill not continued", join(first, cont("not the delivered text", "d1")), true, true, "bad"},
		{"second role chunk", join(first, secondRole), true, true, "bad"},
		{"two [DONE]", join(first, rest, []string{"data: [DONE]\n\n"}), true, true, "bad"},
		{"continuation's own identity", join(first, cont(delivered, "d2")), true, true, "bad"},
		{"no final finish_reason", join(first, noFinish), true, true, "bad"},
		{"cut again after a mix", join(first, cont("", "d1")[:3], []string{errEvent}), false, true, "bad"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}}
			resp.Header.Set("Content-Type", "text/event-stream")
			resp.Header.Set("X-Soak-Upstream", "d1")
			resp.Header.Set("X-Soak-Fault", "cut")
			var rerr error
			if !c.complete {
				rerr = io.ErrUnexpectedEOF
			}
			class, problem := soakClassify(resp, c.body, rerr, id, c.resume)
			if class != c.want {
				t.Errorf("class %q (%s), want %q; body:\n%s", class, problem, c.want, c.body)
			}
		})
	}
}

// soakDeltaContent is the content of one chunk event ("" for others).
func soakDeltaContent(t *testing.T, ev string) string {
	t.Helper()
	var ch struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	payload, ok := strings.CutPrefix(strings.TrimSuffix(ev, "\n\n"), "data: ")
	if !ok || json.Unmarshal([]byte(payload), &ch) != nil || len(ch.Choices) == 0 {
		return ""
	}
	return ch.Choices[0].Delta.Content
}
