package integration

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
)

// nativeFinalEvents is a whole native stream per front and the line that
// starts its final event.
var nativeFinalEvents = map[string]struct {
	path, body, final string
	events            []string
}{
	"messages": {
		path:  "/v1/messages",
		body:  `{"model":"acc","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		final: "event: message_stop",
		events: []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"x\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"all of it\"}}\n\n",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":3}}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		},
	},
	"responses": {
		path:  "/v1/responses",
		body:  `{"model":"acc","stream":true,"input":"hi"}`,
		final: "event: response.completed",
		events: []string{
			"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"all of it\"}\n\n",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":1,\"output_tokens\":3,\"total_tokens\":4}}}\n\n",
		},
	},
}

// accountingProxy: model acc on one native upstream (messages and
// responses), backoff on, no prober, so a wrongly blamed attempt shows.
func accountingProxy(t *testing.T, up *fakeUpstream) *proxy {
	return startProxy(t, cfg(
		[]map[string]any{obj("id", "acc-p", "url", up.base(), "apis", []string{"chat", "messages", "responses"},
			"backoff", "10s", "probe_interval", "0s")},
		[]map[string]any{obj("id", "acc-u", "provider", "acc-p", "model", "x")},
		[]map[string]any{obj("name", "acc", "upstreams", []string{"acc-u"})}))
}

// resultDelta waits until the attempt's result is recorded and returns how
// each result moved from before.
func resultDelta(t *testing.T, p *proxy, before map[string]float64) map[string]float64 {
	t.Helper()
	results := []string{"ok", "cancelled", "net_err", "timeout"}
	total := func() (sum float64) {
		for _, r := range results {
			sum += p.requests("acc", "acc-u", "acc-p", r) - before[r]
		}
		return sum
	}
	faultEventually(t, 30*time.Second, "the attempt recorded", func() bool { return total() > 0 })
	d := map[string]float64{}
	for _, r := range results {
		d[r] = p.requests("acc", "acc-u", "acc-p", r) - before[r]
	}
	return d
}

func resultsNow(p *proxy) map[string]float64 {
	m := map[string]float64{}
	for _, r := range []string{"ok", "cancelled", "net_err", "timeout"} {
		m[r] = p.requests("acc", "acc-u", "acc-p", r)
	}
	return m
}

// TestNativeStreamFinalEventThenReset: a native Messages (Responses)
// upstream sends its whole stream, message_stop (response.completed)
// included, then resets the connection. The client already has the whole
// answer: the attempt is ok, no error event is appended, and the
// upstream is not backed off.
func TestNativeStreamFinalEventThenReset(t *testing.T) {
	for _, name := range []string{"messages", "responses"} {
		t.Run(name, func(t *testing.T) {
			s := nativeFinalEvents[name]
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				writeStream(w, s.events, 0)
				resetsConnection(w, r)
			})
			p := accountingProxy(t, up)
			before := resultsNow(p)
			resp, err := testClient.Post(p.URL+s.path, "application/json", strings.NewReader(s.body))
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := strings.Join(s.events, ""); string(got) != want {
				t.Fatalf("client got\n%s\nwant the upstream's stream byte for byte\n%s", got, want)
			}
			d := resultDelta(t, p, before)
			if d["ok"] != 1 || d["net_err"] != 0 || d["cancelled"] != 0 {
				t.Fatalf("results %v, want one ok", d)
			}
			if cool := p.upstreamGauge("cooling_seconds", "acc-u", "acc-p"); cool != 0 {
				t.Fatalf("upstream cooling %v after a whole answer", cool)
			}
			if logs := p.logEntries("upstream response broke off"); len(logs) != 0 {
				t.Fatalf("broke-off logged: %v", logs)
			}
		})
	}
}

// TestNativeStreamFinalEventThenClientCloses: the client stops reading
// right after the final event (as SDKs do) while the upstream lingers
// before it closes: ok, not cancelled.
func TestNativeStreamFinalEventThenClientCloses(t *testing.T) {
	for _, name := range []string{"messages", "responses"} {
		t.Run(name, func(t *testing.T) {
			s := nativeFinalEvents[name]
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				writeStream(w, s.events, 0)
				select { // the upstream lingers before it closes
				case <-time.After(5 * time.Second):
				case <-r.Context().Done():
				}
			})
			p := accountingProxy(t, up)
			before := resultsNow(p)
			resp, err := testClient.Post(p.URL+s.path, "application/json", strings.NewReader(s.body))
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			var sawFinal bool
			for sc.Scan() {
				if sc.Text() == s.final {
					sawFinal = true
				}
				if sawFinal && sc.Text() == "" { // the final event's end
					break
				}
			}
			resp.Body.Close()
			if !sawFinal {
				t.Fatal("the final event never reached the client")
			}
			d := resultDelta(t, p, before)
			if d["ok"] != 1 || d["cancelled"] != 0 || d["net_err"] != 0 {
				t.Fatalf("results %v, want one ok", d)
			}
		})
	}
}

// TestNativeStreamCutInFinalEvent: the final event's name line reached
// the client but its data did not (the upstream reset in between): the
// answer is not whole, the attempt is net_err.
func TestNativeStreamCutInFinalEvent(t *testing.T) {
	s := nativeFinalEvents["responses"]
	last := s.events[len(s.events)-1]
	cut := append(append([]string{}, s.events[:len(s.events)-1]...), last[:strings.Index(last, "\n")+1])
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, cut, 0)
		resetsConnection(w, r)
	})
	p := accountingProxy(t, up)
	before := resultsNow(p)
	resp, err := testClient.Post(p.URL+s.path, "application/json", strings.NewReader(s.body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	d := resultDelta(t, p, before)
	if d["net_err"] != 1 || d["ok"] != 0 {
		t.Fatalf("results %v, want one net_err", d)
	}
}

// TestNativeMessagesStreamBreakErrorShape: a native Messages stream cut
// before message_stop ends, for the client, in Anthropic's named
// `event: error` (the Anthropic SDK skips unnamed events, so an
// OpenAI-shaped error would go unseen), which the SDK reports; the
// attempt is net_err.
func TestNativeMessagesStreamBreakErrorShape(t *testing.T) {
	s := nativeFinalEvents["messages"]
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, s.events[:3], 0)
		resetsConnection(w, r)
	})
	p := accountingProxy(t, up)
	before := resultsNow(p)
	resp, err := testClient.Post(p.URL+s.path, "application/json", strings.NewReader(s.body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := strings.Join(s.events[:3], "") + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":"
	if !strings.HasPrefix(string(got), want) || !strings.HasSuffix(string(got), `"code":"stream_interrupted"}}`+"\n\n") {
		t.Fatalf("client got\n%s", got)
	}
	if d := resultDelta(t, p, before); d["net_err"] != 1 {
		t.Fatalf("results %v, want one net_err", d)
	}

	// The SDK's view, on an upstream the first break did not back off.
	p2 := startProxy(t, cfg(
		[]map[string]any{obj("id", "acc2-p", "url", up.base(), "apis", []string{"messages"}, "probe_interval", "0s")},
		[]map[string]any{obj("id", "acc2-u", "provider", "acc2-p", "model", "x")},
		[]map[string]any{obj("name", "acc2", "upstreams", []string{"acc2-u"})}))
	c := anthropicClient(p2)
	st := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "acc2", MaxTokens: 16, Messages: []anthropic.MessageParam{userText("hi")}})
	for st.Next() {
	}
	if err := st.Err(); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("SDK stream error %v, want the proxy's interrupted error", err)
	}
}
