package integration

// Streams whose upstream ends cleanly but before the answer's end: a
// backend process killed mid-answer with a close-delimited body (no
// Content-Length, no chunked encoding: the end of the body is the server
// closing the connection), or an engine that stops a generation without a
// finish reason. The proxy reads a clean EOF; the answer is still cut.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// closeDelimited answers with an SSE response that has neither a
// Content-Length nor chunked encoding, writes events and closes the
// connection (FIN, no RST): the body ends at the close.
func closeDelimited(events []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, brw := faultHijack(w)
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n")
		_ = brw.Flush()
		for _, ev := range events {
			_, _ = brw.WriteString(ev)
			_ = brw.Flush()
		}
	}
}

// unfinishedConfig is model "m" on one upstream "a" (provider "pa"), with
// apis when given, a backoff, and no prober (cooling must stay visible).
func unfinishedConfig(up *fakeUpstream, apis ...string) map[string]any {
	prov := obj("id", "pa", "url", up.base(), "probe_interval", "0s", "backoff", "30s")
	if len(apis) > 0 {
		prov["apis"] = apis
	}
	return cfg([]map[string]any{prov},
		[]map[string]any{obj("id", "a", "provider", "pa", "model", "real-a")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"a"})})
}

// postPath sends a JSON POST to a path of the proxy (Anthropic's version
// header on …/messages).
func (p *proxy) postPath(path, body string) *http.Response {
	p.t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if strings.HasSuffix(path, "/messages") {
		req.Header.Set("Anthropic-Version", "2023-06-01")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		p.t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// wantBlamed checks that upstream "a" was counted net_err once more than
// before (n0) and has a failure streak, and (cooled: it has a backoff) is
// cooling.
func wantBlamed(t *testing.T, p *proxy, n0 float64, cooled bool) {
	t.Helper()
	if d := p.requests("m", "a", "pa", "net_err") - n0; d != 1 {
		t.Errorf("net_err counted %v, want 1 (ok %v)", d, p.requests("m", "a", "pa", "ok"))
	}
	if s := p.upstreamGauge("fail_streak", "a", "pa"); s != 1 {
		t.Errorf("fail_streak = %v, want 1", s)
	}
	if c := p.upstreamGauge("cooling_seconds", "a", "pa"); cooled && c <= 0 {
		t.Errorf("cooling_seconds = %v, want > 0", c)
	}
}

// TestCloseDelimitedFake: the fake really sends a body whose end is the
// connection's close.
func TestCloseDelimitedFake(t *testing.T) {
	up := newUpstream(t, closeDelimited(firstEvents(3)))
	resp, err := testClient.Post(up.base()+"/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.ContentLength != -1 || len(resp.TransferEncoding) != 0 || !resp.Close {
		t.Fatalf("read error %v, Content-Length %d, Transfer-Encoding %v, close %v", err, resp.ContentLength, resp.TransferEncoding, resp.Close)
	}
	if string(body) != strings.Join(firstEvents(3), "") {
		t.Fatalf("body %q", body)
	}
}

// TestUnfinishedStreamChat: a chat stream with neither a finish reason nor
// [DONE] is cut: the client gets the stream_interrupted error event and an
// aborted transfer, the upstream is counted net_err and backed off; with
// resume on another upstream finishes the answer. A finish reason without
// [DONE] is a whole answer.
func TestUnfinishedStreamChat(t *testing.T) {
	const req = `{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`
	t.Run("cut", func(t *testing.T) {
		up := newUpstream(t, closeDelimited(firstEvents(20)))
		p := startProxy(t, unfinishedConfig(up))
		n0 := p.requests("m", "a", "pa", "net_err")
		resp := p.chat(req)
		body, err := faultRead(resp)
		faultAbortedWith(t, body, err, strings.Join(firstEvents(20), ""), "stream_interrupted")
		wantBlamed(t, p, n0, true)
		var logged bool
		for _, e := range p.logEntries("upstream response broke off") {
			logged = logged || e["upstream"] == "a" && e["reason"] == "stream_interrupted"
		}
		if !logged {
			t.Error("no WARN log naming the cut")
		}
	})
	// A finish reason makes the answer whole, whether the body then ends
	// cleanly without [DONE] or breaks (a chunked body's unexpected EOF):
	// a success, without an error event, a backoff or a continuation.
	for _, tc := range []struct {
		name  string
		serve func([]string) http.HandlerFunc
	}{
		{"finish reason without [DONE]", closeDelimited},
		{"finish reason, then cut", faultChunkedCut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := resumeA.events(resumeTokens[:5], 5)
			ev = ev[:len(ev)-1] // finish and usage, no [DONE]
			up := newUpstream(t, tc.serve(ev))
			p := startProxy(t, unfinishedConfig(up))
			body, err := faultRead(p.chat(req))
			if err != nil || body != strings.Join(ev, "") {
				t.Fatalf("read error %v, body %q", err, tail(body, 300))
			}
			if d := p.requests("m", "a", "pa", "ok"); d != 1 {
				t.Errorf("ok counted %v, want 1", d)
			}
			if s := p.upstreamGauge("fail_streak", "a", "pa"); s != 0 {
				t.Errorf("fail_streak = %v, want 0", s)
			}
		})
	}
	t.Run("[DONE] without finish reason", func(t *testing.T) {
		ev := append(firstEvents(5), "data: [DONE]\n\n")
		up := newUpstream(t, closeDelimited(ev))
		p := startProxy(t, unfinishedConfig(up))
		body, err := faultRead(p.chat(req))
		if err != nil || body != strings.Join(ev, "") {
			t.Fatalf("read error %v, body %q", err, tail(body, 300))
		}
	})
	t.Run("resume on, closed inside an event", func(t *testing.T) {
		// The half event never reaches the client; the answer is whole.
		ev := firstEvents(40)
		half := resumeA.chunk(`{"content":"w40 "}`, "")
		a := newUpstream(t, closeDelimited(append(ev, half[:len(half)/2])))
		b := newUpstream(t, deterministic(resumeB, false, 1))
		p := startProxy(t, resumeConfig(a, b, "30s"))
		body, err := faultRead(p.chat(req))
		if err != nil {
			t.Fatalf("read error %v; body %q", err, tail(body, 300))
		}
		resumedStream(t, body, resumeFull, 20)
	})
	t.Run("resume on", func(t *testing.T) {
		a := newUpstream(t, closeDelimited(firstEvents(40)))
		b := newUpstream(t, deterministic(resumeB, false, 1))
		p := startProxy(t, resumeConfig(a, b, "30s"))
		n0, ok0 := p.requests("m", "a", "pa", "net_err"), p.resumes("ok")
		body, err := faultRead(p.chat(req))
		if err != nil {
			t.Fatalf("read error %v; body %q", err, tail(body, 300))
		}
		resumedStream(t, body, resumeFull, 20)
		if d := p.resumes("ok") - ok0; d != 1 {
			t.Errorf("resumes ok counted %v, want 1", d)
		}
		wantBlamed(t, p, n0, false)
		calls := b.Calls()
		if len(calls) != 1 {
			t.Fatalf("second upstream got %d calls, want 1", len(calls))
		}
		if prefix, ok := lastAssistant(calls[0].Body); !ok || prefix != strings.Join(resumeTokens[:40], "") {
			t.Errorf("prefill = %q (assistant %v), want the 40 delivered tokens", prefix, ok)
		}
	})
}

// TestUnfinishedStreamMessages: on the Messages front, a chat upstream's
// stream that ends without a finish becomes Anthropic's event: error (never
// message_stop or a stop_reason the upstream did not give); with resume on
// the Anthropic SDK gets the whole message. A native Messages stream that
// ends before message_stop is cut the same way.
func TestUnfinishedStreamMessages(t *testing.T) {
	const req = `{"model":"m","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"count"}]}`
	t.Run("translated", func(t *testing.T) {
		up := newUpstream(t, closeDelimited(firstEvents(20)))
		p := startProxy(t, unfinishedConfig(up))
		n0 := p.requests("m", "a", "pa", "net_err")
		resp := p.postPath("/v1/messages", req)
		body, err := faultRead(resp)
		if err == nil {
			t.Errorf("the body ended with a clean EOF; an aborted transfer was expected")
		}
		body, _ = faultStripKeepalives(t, body)
		if strings.Contains(body, "message_stop") || strings.Contains(body, `"stop_reason":"end_turn"`) {
			t.Errorf("a cut stream was ended as a whole message: %q", tail(body, 400))
		}
		events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
		last := events[len(events)-1]
		if !strings.HasPrefix(last, "event: error\ndata: ") || !strings.Contains(last, `"code":"stream_interrupted"`) ||
			!strings.Contains(last, `"type":"api_error"`) {
			t.Errorf("last event %q, want Anthropic's event: error with code stream_interrupted", last)
		}
		if !strings.Contains(body, `"text":"w19 "`) {
			t.Errorf("the delivered text is missing: %q", tail(body, 400))
		}
		wantBlamed(t, p, n0, true)

		// The Anthropic SDK reports an error rather than a finished message.
		time.Sleep(1100 * time.Millisecond) // the 1 s cooling
		c := anthropicClient(p)
		st := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 256,
			Messages: []anthropic.MessageParam{userText("count")}})
		var acc anthropic.Message
		for st.Next() {
			_ = acc.Accumulate(st.Current())
		}
		if st.Err() == nil || acc.StopReason != "" {
			t.Errorf("SDK: error %v, stop_reason %q; want an error and no stop_reason", st.Err(), acc.StopReason)
		}
	})
	t.Run("resume on", func(t *testing.T) {
		a := newUpstream(t, closeDelimited(firstEvents(40)))
		b := newUpstream(t, deterministic(resumeB, false, 1))
		p := startProxy(t, resumeConfig(a, b, "30s"))
		n0 := p.requests("m", "a", "pa", "net_err")
		acc := streamMessage(t, anthropicClient(p), countParams)
		if len(acc.Content) != 1 || acc.Content[0].Text != resumeFull || acc.StopReason != "end_turn" {
			t.Fatalf("message = %+v", acc)
		}
		wantBlamed(t, p, n0, false)
	})
	t.Run("native", func(t *testing.T) {
		ev := func(name, data string) string { return fmt.Sprintf("event: %s\ndata: %s\n\n", name, data) }
		events := []string{
			ev("message_start", `{"type":"message_start","message":{"id":"msg_native1","type":"message","role":"assistant","model":"real-model","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":0}}}`),
			ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
			ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"half a sen"}}`),
		}
		up := newUpstream(t, closeDelimited(events))
		p := startProxy(t, unfinishedConfig(up, "chat", "messages"))
		n0 := p.requests("m", "a", "pa", "net_err")
		body, err := faultRead(p.postPath("/v1/messages", req))
		if err == nil {
			t.Errorf("the body ended with a clean EOF; an aborted transfer was expected")
		}
		body, _ = faultStripKeepalives(t, body)
		before, last, _ := strings.Cut(body, "event: error\n")
		if before != strings.Join(events, "") || !strings.Contains(last, `"code":"stream_interrupted"`) {
			t.Errorf("body %q: want the upstream's events, then event: error with code stream_interrupted", body)
		}
		if calls := up.Calls(); len(calls) != 1 || calls[0].Path != "/v1/messages" {
			t.Fatalf("upstream calls %+v, want one native /v1/messages", calls)
		}
		wantBlamed(t, p, n0, true)
	})
	// A native stream that ends with the upstream's own error event has
	// its end: the client has the upstream's account, and no second error
	// event follows it. A native stream whose events are not named cannot
	// be judged by name, and passes as it ends.
	t.Run("native ends", func(t *testing.T) {
		ev := func(name, data string) string { return fmt.Sprintf("event: %s\ndata: %s\n\n", name, data) }
		start := `{"type":"message_start","message":{"id":"msg_native2","type":"message","role":"assistant","model":"real-model","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":0}}}`
		for _, tc := range []struct {
			name   string
			events []string
		}{
			{"upstream error event", []string{ev("message_start", start),
				ev("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)}},
			{"unnamed events", []string{"data: " + start + "\n\n",
				`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}` + "\n\n"}},
		} {
			up := newUpstream(t, closeDelimited(tc.events))
			p := startProxy(t, unfinishedConfig(up, "chat", "messages"))
			body, err := faultRead(p.postPath("/v1/messages", req))
			if err != nil {
				t.Errorf("%s: the transfer was aborted (%v); the upstream's stream ended as it was", tc.name, err)
			}
			if body, _ = faultStripKeepalives(t, body); body != strings.Join(tc.events, "") {
				t.Errorf("%s: body %q, want the upstream's events as they came", tc.name, body)
			}
			if n := p.requests("m", "a", "pa", "net_err"); n != 0 {
				t.Errorf("%s: net_err counted %v, want 0", tc.name, n)
			}
		}
	})
}

// TestUnfinishedStreamResponses: on the Responses front a chat stream that
// ends without a finish becomes response.failed (never response.completed);
// with resume on the SDK gets the whole response. A native Responses stream
// that ends before its final event is cut the same way.
func TestUnfinishedStreamResponses(t *testing.T) {
	const req = `{"model":"m","input":"count","stream":true}`
	t.Run("translated", func(t *testing.T) {
		up := newUpstream(t, closeDelimited(firstEvents(20)))
		p := startProxy(t, unfinishedConfig(up))
		n0 := p.requests("m", "a", "pa", "net_err")
		body, err := faultRead(p.postPath("/v1/responses", req))
		if err == nil {
			t.Errorf("the body ended with a clean EOF; an aborted transfer was expected")
		}
		body, _ = faultStripKeepalives(t, body)
		if strings.Contains(body, "response.completed") || strings.Contains(body, "response.incomplete") {
			t.Errorf("a cut stream was ended as a whole response: %q", tail(body, 400))
		}
		events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
		last := events[len(events)-1]
		if !strings.HasPrefix(last, "event: response.failed\ndata: ") || !strings.Contains(last, `"code":"stream_interrupted"`) {
			t.Errorf("last event %q, want response.failed with code stream_interrupted", last)
		}
		if !strings.Contains(body, `"delta":"w19 "`) {
			t.Errorf("the delivered text is missing: %q", tail(body, 400))
		}
		wantBlamed(t, p, n0, true)
	})
	t.Run("resume on", func(t *testing.T) {
		a := newUpstream(t, closeDelimited(firstEvents(40)))
		b := newUpstream(t, deterministic(resumeB, false, 1))
		p := startProxy(t, resumeConfig(a, b, "30s"))
		n0 := p.requests("m", "a", "pa", "net_err")
		c := responsesClient(p)
		st := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "m",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("count")}})
		var text string
		var final responses.Response
		for st.Next() {
			switch ev := st.Current(); ev.Type {
			case "response.output_text.delta":
				text += ev.Delta
			case "response.completed":
				final = ev.Response
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if text != resumeFull || final.OutputText() != resumeFull {
			t.Fatalf("text %q, final %q", text, final.OutputText())
		}
		wantBlamed(t, p, n0, false)
	})
	t.Run("native", func(t *testing.T) {
		events := []string{
			"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_n1\",\"object\":\"response\",\"created_at\":1,\"status\":\"in_progress\",\"model\":\"real-model\",\"output\":[]}}\n\n",
			"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"msg_n1\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_n1\",\"output_index\":0,\"content_index\":0,\"delta\":\"half a sen\"}\n\n",
		}
		up := newUpstream(t, closeDelimited(events))
		p := startProxy(t, unfinishedConfig(up, "chat", "responses"))
		n0 := p.requests("m", "a", "pa", "net_err")
		body, err := faultRead(p.postPath("/v1/responses", req))
		if err == nil {
			t.Errorf("the body ended with a clean EOF; an aborted transfer was expected")
		}
		body, _ = faultStripKeepalives(t, body)
		if !strings.HasPrefix(body, strings.Join(events, "")) || !strings.Contains(body[len(strings.Join(events, "")):], `"code":"stream_interrupted"`) {
			t.Errorf("body %q: want the upstream's events, then an error event with code stream_interrupted", body)
		}
		if calls := up.Calls(); len(calls) != 1 || calls[0].Path != "/v1/responses" {
			t.Fatalf("upstream calls %+v, want one native /v1/responses", calls)
		}
		wantBlamed(t, p, n0, true)
	})
}

// TestEmptyStreamFailsOver: an upstream that answers 200 with an event
// stream and closes it without a byte gave no answer; nothing has reached
// the client, so the next upstream answers. With none left the client gets
// the 503 of a failed request, not an empty 200.
func TestEmptyStreamFailsOver(t *testing.T) {
	a := newUpstream(t, closeDelimited(nil))
	b := newUpstream(t, completion("from b"))
	conf := resumeConfig(a, b, "30s")
	conf["models"] = []map[string]any{obj("name", "m", "upstreams", []string{"a", "b"})}
	p := startProxy(t, conf)
	n0 := p.requests("m", "a", "pa", "net_err")
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	body, err := faultRead(resp)
	if err != nil || resp.StatusCode != http.StatusOK || body != strings.Join(sseChunks("from b"), "") {
		t.Fatalf("status %d, read error %v, body %q: want b's stream", resp.StatusCode, err, body)
	}
	wantBlamed(t, p, n0, false)

	conf["models"] = []map[string]any{obj("name", "m", "upstreams", []string{"a"})}
	p.load(conf)
	resp = p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	body, _ = faultRead(resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "all_upstreams_failed") {
		t.Fatalf("status %d body %q: want 503 all_upstreams_failed", resp.StatusCode, body)
	}
}
