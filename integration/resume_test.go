package integration

// Mid-stream continuation (model resume): a stream that breaks
// after the client got part of the answer is finished by another upstream,
// and the client sees one well-formed stream.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// resumeTokens is the 60-token answer every fake model of these tests
// gives; resumeFull is its text.
var resumeTokens = func() []string {
	t := make([]string, 60)
	for i := range t {
		t[i] = fmt.Sprintf("w%d ", i)
	}
	return t
}()

var resumeFull = strings.Join(resumeTokens, "")

// resumeModel is one fake provider's stream identity.
type resumeModel struct {
	id      string
	created int
	model   string
}

func (m resumeModel) chunk(delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = fmt.Sprintf("%q", finish)
	}
	return fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
		m.id, m.created, m.model, delta, f)
}

// events is a stream of pieces: a role chunk, one chunk per piece, the
// finish chunk, a usage chunk (completion_tokens = outTokens) and [DONE].
func (m resumeModel) events(pieces []string, outTokens int) []string {
	ev := []string{m.chunk(`{"role":"assistant","content":""}`, "")}
	for _, p := range pieces {
		ev = append(ev, m.chunk(fmt.Sprintf(`{"content":%q}`, p), ""))
	}
	ev = append(ev, m.chunk(`{}`, "stop"))
	ev = append(ev, fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n",
		m.id, m.created, m.model, outTokens, outTokens+7))
	return append(ev, "data: [DONE]\n\n")
}

// lastAssistant returns the content of a chat request's final message when
// it is an assistant message (a prefill).
func lastAssistant(body []byte) (string, bool) {
	var req struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		return "", false
	}
	last := req.Messages[len(req.Messages)-1]
	return last.Content, last.Role == "assistant"
}

// deterministic is a fake model that always gives resumeFull: after an
// assistant prefill it streams only what follows the prefill (as a real
// model continuing its own text does); without one, the whole answer.
// rejectPrefill answers a prefill with 400 like providers that refuse it.
// piece sets how many tokens go in one chunk, so that a replay's chunk
// boundaries need not line up with the first upstream's.
func deterministic(m resumeModel, rejectPrefill bool, piece int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, 0, 1024)
		buf := make([]byte, 512)
		for {
			n, err := r.Body.Read(buf)
			body = append(body, buf[:n]...)
			if err != nil {
				break
			}
		}
		text := resumeFull
		if prefix, ok := lastAssistant(body); ok {
			if rejectPrefill {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, `{"error":{"message":"This model does not support assistant message prefill. The conversation must end with a user message.","type":"invalid_request_error","code":"invalid_request_error"}}`)
				return
			}
			if !strings.HasPrefix(resumeFull, prefix) {
				text = "PREFILL-MISMATCH"
			} else {
				text = resumeFull[len(prefix):]
			}
		}
		tokens := strings.SplitAfter(strings.TrimSuffix(text, " "), " ")
		tokens[len(tokens)-1] += " "
		var pieces []string
		for i := 0; i < len(tokens); i += piece {
			pieces = append(pieces, strings.Join(tokens[i:min(i+piece, len(tokens))], ""))
		}
		writeStream(w, m.events(pieces, len(tokens)), 0)
	}
}

var (
	resumeA = resumeModel{"chatcmpl-first", 111, "real-a"}
	resumeB = resumeModel{"chatcmpl-second", 222, "real-b"}
)

// firstEvents is the first upstream's stream up to n tokens, without end.
func firstEvents(n int) []string {
	ev := resumeA.events(resumeTokens[:n], n)
	return ev[:len(ev)-3] // no finish, usage or [DONE]
}

// resumeConfig is a model "m" (resume on) over upstreams "a" (behave a)
// and "b" (behave b), with extra upstream-b fields.
func resumeConfig(a, b *fakeUpstream, idleA string, bFields ...any) map[string]any {
	ub := obj(append([]any{"id", "b", "provider", "pb", "model", "real-b"}, bFields...)...)
	return cfg(
		[]map[string]any{
			obj("id", "pa", "url", a.base(), "stream_idle_timeout", idleA, "probe_interval", "0s"),
			obj("id", "pb", "url", b.base(), "probe_interval", "0s"),
		},
		[]map[string]any{obj("id", "a", "provider", "pa", "model", "real-a"), ub},
		[]map[string]any{obj("name", "m", "upstreams", []string{"a", "b"}, "resume", "on")},
		"heartbeat_interval", "100ms")
}

// countResumed sends the fixtures' streamed "count" request through p and
// checks that the client got one whole stream, however many upstreams
// wrote it.
func countResumed(t *testing.T, p *proxy) string {
	t.Helper()
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`)
	body, err := faultRead(resp)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, read error %v (a resumed stream ends cleanly); body %q", resp.StatusCode, err, tail(body, 300))
	}
	resumedStream(t, body, resumeFull, 20)
	return body
}

// wantPrefill checks that a continuation call carried the first n
// delivered tokens as its final assistant message.
func wantPrefill(t *testing.T, call upstreamCall, n int) {
	t.Helper()
	if prefix, ok := lastAssistant(call.Body); !ok || prefix != strings.Join(resumeTokens[:n], "") {
		t.Errorf("prefill %q (assistant message %v), want the %d delivered tokens", prefix, ok, n)
	}
}

// resumedStream checks a client stream that must be one whole answer: the
// text equals want, one role chunk, every chunk carries the first
// upstream's id/created/model, the last choice chunk says stop, the usage
// is the continuation's (outTokens), and exactly one [DONE] ends it.
func resumedStream(t *testing.T, body string, want string, outTokens int) {
	t.Helper()
	body, _ = faultStripKeepalives(t, body)
	if strings.Contains(body, `"error"`) {
		t.Fatalf("error event in a resumed stream: %q", tail(body, 300))
	}
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	if events[len(events)-1] != "data: [DONE]" || strings.Count(body, "data: [DONE]") != 1 {
		t.Fatalf("stream does not end with exactly one [DONE]: %q", tail(body, 300))
	}
	var text strings.Builder
	roles, finish, usage := 0, "", 0
	for _, ev := range events[:len(events)-1] {
		payload, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(payload, "\n") {
			t.Fatalf("not one data line: %q", ev)
		}
		var ch struct {
			ID      string `json:"id"`
			Created int    `json:"created"`
			Model   string `json:"model"`
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(payload), &ch); err != nil {
			t.Fatalf("chunk %q: %v", payload, err)
		}
		if ch.ID != resumeA.id || ch.Created != resumeA.created || ch.Model != resumeA.model {
			t.Errorf("chunk id/created/model = %s/%d/%s, want the first upstream's %s/%d/%s", ch.ID, ch.Created, ch.Model, resumeA.id, resumeA.created, resumeA.model)
		}
		for _, c := range ch.Choices {
			if c.Delta.Role != "" {
				roles++
			}
			text.WriteString(c.Delta.Content)
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
		if ch.Usage != nil {
			usage = ch.Usage.CompletionTokens
		}
	}
	if text.String() != want {
		t.Errorf("client text\n got %q\nwant %q", text.String(), want)
	}
	if roles != 1 {
		t.Errorf("%d role chunks, want 1", roles)
	}
	if finish != "stop" {
		t.Errorf("final finish_reason %q, want stop", finish)
	}
	if usage != outTokens {
		t.Errorf("usage completion_tokens %d, want the continuation's %d", usage, outTokens)
	}
}

func (p *proxy) resumes(result string) float64 {
	p.t.Helper()
	return p.metric("llm_proxy_stream_resumes_total", "model", "m", "result", result)
}

// TestResumeCutPrefill: the first upstream is reset after 40 of 60 tokens;
// the second takes the delivered text as an assistant prefill and returns
// exactly the rest.
func TestResumeCutPrefill(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(40)))
	b := newUpstream(t, deterministic(resumeB, false, 1))
	p := startProxy(t, resumeConfig(a, b, "30s"))
	ok0, cut0, b0 := p.resumes("ok"), p.requests("m", "a", "pa", "net_err"), p.requests("m", "b", "pb", "ok")

	start := time.Now()
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`)
	body, err := faultRead(resp)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, read error %v (a resumed stream ends cleanly); body %q", resp.StatusCode, err, tail(body, 300))
	}
	resumedStream(t, body, resumeFull, 20)
	t.Logf("cut after 40 of 60 tokens, prefill upstream next: one whole 60-token stream after %v", time.Since(start).Round(time.Millisecond))

	calls := b.Calls()
	if len(calls) != 1 {
		t.Fatalf("second upstream got %d calls, want 1", len(calls))
	}
	if prefix, ok := lastAssistant(calls[0].Body); !ok || prefix != strings.Join(resumeTokens[:40], "") {
		t.Errorf("prefill = %q (assistant %v), want the 40 delivered tokens", prefix, ok)
	}
	if !strings.Contains(string(calls[0].Body), `"model":"real-b"`) || !strings.Contains(string(calls[0].Body), `"stream":true`) {
		t.Errorf("continuation body %s: want model real-b, stream true", calls[0].Body)
	}
	if d := p.resumes("ok") - ok0; d != 1 {
		t.Errorf("resumes ok counted %v, want 1", d)
	}
	if d := p.requests("m", "a", "pa", "net_err") - cut0; d != 1 {
		t.Errorf("first upstream net_err counted %v, want 1", d)
	}
	if d := p.requests("m", "b", "pb", "ok") - b0; d != 1 {
		t.Errorf("second upstream ok counted %v, want 1", d)
	}
	var logged bool
	for _, e := range p.logEntries("stream resumed") {
		logged = logged || e["from"] == "a" && e["to"] == "b"
	}
	var path bool
	for _, e := range p.logEntries("continuing stream") {
		path = path || e["from"] == "a" && e["to"] == "b" && e["path"] == "prefill"
	}
	if !logged || !path {
		t.Errorf("log entries naming both upstreams: stream resumed %v, continuing stream (prefill) %v", logged, path)
	}
	faultEventually(t, 30*time.Second, "slots free", func() bool {
		return p.upstreamGauge("inflight", "a", "pa") == 0 && p.upstreamGauge("inflight", "b", "pb") == 0
	})

	t.Run("tcp reset", func(t *testing.T) {
		// A reset may lose what the kernel still held: the prefill is
		// whatever reached the client, and the answer is still whole.
		a.setHandler(resetAfter(firstEvents(40)))
		n := len(b.Calls())
		resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`)
		body, err := faultRead(resp)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, read error %v; body %q", resp.StatusCode, err, tail(body, 300))
		}
		calls := b.Calls()[n:]
		if len(calls) != 1 {
			t.Fatalf("second upstream got %d calls, want 1", len(calls))
		}
		prefix, ok := lastAssistant(calls[0].Body)
		if !ok || prefix == "" || !strings.HasPrefix(resumeFull, prefix) {
			t.Fatalf("prefill %q (%v)", prefix, ok)
		}
		resumedStream(t, body, resumeFull, len(strings.Fields(resumeFull[len(prefix):])))
	})
}

// TestResumeStall: the first upstream stalls after 20 tokens; after its
// stream_idle_timeout the answer is finished elsewhere. The numbers
// are a 30 s stall against stream_idle_timeout 10s; the stall here lasts
// until the proxy gives up, against 1s, so the test takes seconds.
func TestResumeStall(t *testing.T) {
	a := newUpstream(t, faultStallAfter(firstEvents(20)))
	b := newUpstream(t, deterministic(resumeB, false, 1))
	p := startProxy(t, resumeConfig(a, b, "1s"))
	timeouts := p.requests("m", "a", "pa", "timeout")
	start := time.Now()
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`)
	body, err := faultRead(resp)
	elapsed := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, read error %v; body %q", resp.StatusCode, err, tail(body, 300))
	}
	resumedStream(t, body, resumeFull, 40)
	if elapsed < time.Second || elapsed > 15*time.Second {
		t.Errorf("answered after %v; want a little over stream_idle_timeout (1s)", elapsed)
	}
	if d := p.requests("m", "a", "pa", "timeout") - timeouts; d != 1 {
		t.Errorf("first upstream timeout counted %v, want 1", d)
	}
	t.Logf("stall after 20 tokens, stream_idle_timeout 1s: one whole stream after %v", elapsed.Round(time.Millisecond))

	t.Run("the issue's numbers: 30 s stall, stream_idle_timeout 10s", func(t *testing.T) {
		rest := resumeA.events(resumeTokens[20:], 60)[1:]
		a := newUpstream(t, faultStallFor(firstEvents(20), 30*time.Second, rest))
		b := newUpstream(t, deterministic(resumeB, false, 1))
		p := startProxy(t, resumeConfig(a, b, "10s"))
		start := time.Now()
		resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`)
		body, err := faultRead(resp)
		elapsed := time.Since(start)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, read error %v; body %q", resp.StatusCode, err, tail(body, 300))
		}
		resumedStream(t, body, resumeFull, 40)
		if elapsed < 10*time.Second || elapsed > 25*time.Second {
			t.Errorf("answered after %v; want a little over stream_idle_timeout (10s), well before the stall ends (30s)", elapsed)
		}
		t.Logf("stall of 30 s after 20 tokens, stream_idle_timeout 10s: one whole stream after %v", elapsed.Round(time.Millisecond))
	})
}

// TestResumePrefillRejected: the second upstream refuses assistant prefill
// with a 400; the proxy replays the request there, holds the regenerated
// text back until it matches the 40 delivered tokens (its chunks carry
// three tokens each, so a chunk straddles the seam), then sends the rest.
func TestResumePrefillRejected(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(40)))
	b := newUpstream(t, deterministic(resumeB, true, 3))
	p := startProxy(t, resumeConfig(a, b, "30s"))
	// 40 tokens do not split into threes: the seam falls inside a chunk.
	start := time.Now()
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`)
	body, err := faultRead(resp)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, read error %v; body %q", resp.StatusCode, err, tail(body, 300))
	}
	resumedStream(t, body, resumeFull, 60)
	t.Logf("cut after 40 tokens, next upstream rejects prefill (400): replayed there, held back, one whole stream after %v", time.Since(start).Round(time.Millisecond))
	calls := b.Calls()
	if len(calls) != 2 {
		t.Fatalf("second upstream got %d calls, want 2 (prefill, then replay)", len(calls))
	}
	if _, ok := lastAssistant(calls[0].Body); !ok {
		t.Errorf("first call to b is not a prefill: %s", calls[0].Body)
	}
	if _, ok := lastAssistant(calls[1].Body); ok {
		t.Errorf("second call to b is a prefill again: %s", calls[1].Body)
	}
	if len(p.logEntries("prefill rejected, replaying")) == 0 {
		t.Error("no prefill rejected log entry")
	}
}

// TestResumeReplayDiverges: a replay that regenerates different text is
// never mixed into the answer: the client keeps the 40 tokens it had, then
// gets the error event and an aborted transfer.
func TestResumeReplayDiverges(t *testing.T) {
	first := firstEvents(40)
	a := newUpstream(t, faultChunkedCut(first))
	other := append(strings.SplitAfter(strings.Repeat("x ", 30), " ")[:30], resumeTokens[:50]...)
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, resumeB.events(other, len(other)), 0)
	})
	p := startProxy(t, resumeConfig(a, b, "30s", "prefill", false))
	div0 := p.resumes("diverged")
	start := time.Now()
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`)
	body, err := faultRead(resp)
	faultAbortedWith(t, body, err, strings.Join(first, ""), "stream_interrupted")
	t.Logf("cut after 40 tokens, replay diverges: the 40 tokens, the error event, an abort after %v", time.Since(start).Round(time.Millisecond))
	if d := p.resumes("diverged") - div0; d != 1 {
		t.Errorf("resumes diverged counted %v, want 1", d)
	}
	if n := len(b.Calls()); n != 1 {
		t.Fatalf("second upstream got %d calls, want 1 replay", n)
	}
	if _, ok := lastAssistant(b.Calls()[0].Body); ok {
		t.Error("prefill false upstream was sent a prefill")
	}
	var logged bool
	for _, e := range p.logEntries("stream resume failed") {
		logged = logged || e["from"] == "a" && e["to"] == "b" && e["reason"] == "diverged"
	}
	if !logged {
		t.Error("no stream resume failed log entry naming a, b and diverged")
	}
}

// TestResumeNotInToolCall: a stream cut inside a tool call's arguments, or
// one asking for two choices, is not continued: the error event, as without
// resume, and the second upstream is never asked.
func TestResumeNotInToolCall(t *testing.T) {
	tool := []string{
		resumeA.chunk(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"read_file","arguments":""}}]}`, ""),
		resumeA.chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\": \"/etc/"}}]}`, ""),
	}
	a := newUpstream(t, resetAfter(tool))
	b := newUpstream(t, deterministic(resumeB, false, 1))
	p := startProxy(t, resumeConfig(a, b, "30s"))
	failed0 := p.resumes("failed")
	start := time.Now()
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"read it"}],"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}],"stream":true}`)
	body, err := faultRead(resp)
	faultAbortedWith(t, body, err, strings.Join(tool, ""), "stream_interrupted")
	t.Logf("cut inside a tool call's arguments: not continued, the error event and an abort after %v", time.Since(start).Round(time.Millisecond))
	if n := len(b.Calls()); n != 0 {
		t.Errorf("second upstream got %d calls, want none", n)
	}
	if d := p.resumes("failed") - failed0; d != 1 {
		t.Errorf("resumes failed counted %v, want 1", d)
	}
	var reason bool
	for _, e := range p.logEntries("stream resume failed") {
		reason = reason || e["reason"] == "tool_call"
	}
	if !reason {
		t.Error("no stream resume failed log entry with reason tool_call")
	}

	t.Run("n 2", func(t *testing.T) {
		first := firstEvents(10)
		a.setHandler(faultChunkedCut(first))
		resp := p.chat(`{"model":"m","n":2,"messages":[{"role":"user","content":"count"}],"stream":true}`)
		body, err := faultRead(resp)
		faultAbortedWith(t, body, err, strings.Join(first, ""), "stream_interrupted")
		if n := len(b.Calls()); n != 0 {
			t.Errorf("second upstream got %d calls, want none", n)
		}
	})
}

// TestResumeOpenAISDK: the openai SDK's accumulated message from a stream
// cut after 40 tokens equals the one from an uncut stream of the same
// answer.
func TestResumeOpenAISDK(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(40)))
	b := newUpstream(t, deterministic(resumeB, false, 1))
	p := startProxy(t, resumeConfig(a, b, "30s"))
	c := responsesClient(p)
	accumulate := func() openai.ChatCompletionAccumulator {
		t.Helper()
		st := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model:    "m",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("count")},
		})
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			acc.AddChunk(st.Current())
		}
		if err := st.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		return acc
	}
	cut := accumulate()
	a.setHandler(deterministic(resumeA, false, 1)) // the same answer, uncut
	whole := accumulate()
	if len(cut.Choices) != 1 || cut.Choices[0].Message.Content != resumeFull || cut.Choices[0].FinishReason != "stop" {
		t.Fatalf("resumed message = %+v", cut.Choices)
	}
	if cut.Choices[0].Message.Content != whole.Choices[0].Message.Content || cut.Choices[0].Message.Role != whole.Choices[0].Message.Role ||
		cut.ID != whole.ID || cut.Model != whole.Model || cut.Created != whole.Created {
		t.Errorf("resumed %+v\n uncut %+v", cut.ChatCompletion, whole.ChatCompletion)
	}
	if cut.Usage.CompletionTokens != 20 || whole.Usage.CompletionTokens != 60 {
		t.Errorf("usage: resumed %d (want the continuation's 20), uncut %d", cut.Usage.CompletionTokens, whole.Usage.CompletionTokens)
	}
}

// TestResumeMessagesFront: a Messages stream translated from chat is
// continued the same way (the continuation is chat underneath): the
// Anthropic SDK's accumulated message is the whole answer.
func TestResumeMessagesFront(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(40)))
	b := newUpstream(t, deterministic(resumeB, false, 1))
	p := startProxy(t, resumeConfig(a, b, "30s"))
	ok0 := p.resumes("ok")
	acc := streamMessage(t, anthropicClient(p), countParams)
	if len(acc.Content) != 1 || acc.Content[0].Text != resumeFull || acc.StopReason != "end_turn" {
		t.Fatalf("message = %+v", acc)
	}
	if d := p.resumes("ok") - ok0; d != 1 {
		t.Errorf("resumes ok counted %v, want 1", d)
	}
	calls := b.Calls()
	if len(calls) != 1 || calls[0].Path != "/v1/chat/completions" {
		t.Fatalf("second upstream calls %+v", calls)
	}
	if prefix, ok := lastAssistant(calls[0].Body); !ok || prefix != strings.Join(resumeTokens[:40], "") {
		t.Errorf("prefill = %q (%v)", prefix, ok)
	}

	t.Run("a messages-only upstream is passed over", func(t *testing.T) {
		// The continuation is chat: the native Messages upstream between
		// the two cannot take it.
		native := newUpstream(t, nativeMessages("NATIVE"))
		conf := resumeConfig(a, b, "30s")
		conf["providers"] = append(conf["providers"].([]map[string]any), obj("id", "pn", "url", native.base(), "apis", []string{"messages"}, "probe_interval", "0s"))
		conf["upstreams"] = append(conf["upstreams"].([]map[string]any), obj("id", "n", "provider", "pn", "model", "claude"))
		conf["models"] = []map[string]any{obj("name", "m", "upstreams", []string{"a", "n", "b"}, "resume", "on")}
		p.load(conf)
		n0 := len(b.Calls())
		acc := streamMessage(t, anthropicClient(p), countParams)
		if len(acc.Content) != 1 || acc.Content[0].Text != resumeFull {
			t.Fatalf("message = %+v", acc)
		}
		if len(native.Calls()) != 0 || len(b.Calls()) != n0+1 {
			t.Errorf("native upstream calls %d (want 0), chat upstream calls %d (want 1)", len(native.Calls()), len(b.Calls())-n0)
		}
	})
}

// TestResumeConfigValue: resume takes on or off only.
func TestResumeConfigValue(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	conf := basicConfig(up, 0)
	conf["models"] = []any{map[string]any{"name": "m", "upstreams": []string{"u1"}, "resume": "yes"}}
	err := p.loadErr(conf)
	if err == nil || !strings.Contains(err.Error(), `resume: want on or off, got "yes"`) {
		t.Fatalf("load error %v", err)
	}
}

// TestResumeResponsesFrontReplay: a Responses stream translated from chat,
// cut after reasoning and 20 tokens, is finished by a replay upstream
// (prefill false) whose reasoning differs: the client keeps the reasoning
// it had (the regenerated one is left out), the text is whole, sequence
// numbers keep rising and the usage is the continuation's.
func TestResumeResponsesFrontReplay(t *testing.T) {
	reasoned := append([]string{resumeA.chunk(`{"role":"assistant","reasoning_content":"think "}`, ""), resumeA.chunk(`{"reasoning_content":"hard"}`, "")},
		firstEvents(20)[1:]...)
	a := newUpstream(t, faultChunkedCut(reasoned))
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		ev := resumeB.events(nil, 99)
		var pieces []string
		for i := 0; i < len(resumeTokens); i += 7 {
			pieces = append(pieces, resumeB.chunk(fmt.Sprintf(`{"content":%q}`, strings.Join(resumeTokens[i:min(i+7, len(resumeTokens))], "")), ""))
		}
		out := append([]string{ev[0], resumeB.chunk(`{"reasoning_content":"other thoughts"}`, "")}, pieces...)
		writeStream(w, append(out, ev[1:]...), 0)
	})
	p := startProxy(t, resumeConfig(a, b, "30s", "prefill", false))
	c := responsesClient(p)
	st := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("count")}})
	var reasoning, text string
	var final responses.Response
	seq := int64(-1)
	for st.Next() {
		ev := st.Current()
		if ev.SequenceNumber <= seq {
			t.Fatalf("sequence_number %d after %d", ev.SequenceNumber, seq)
		}
		seq = ev.SequenceNumber
		switch ev.Type {
		case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
			reasoning += ev.Delta
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			final = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if reasoning != "think hard" || text != resumeFull || final.Usage.OutputTokens != 99 || final.OutputText() != resumeFull {
		t.Fatalf("reasoning %q\ntext %q\nusage %+v", reasoning, text, final.Usage)
	}
	if _, ok := lastAssistant(b.Calls()[0].Body); ok {
		t.Error("prefill false upstream was sent a prefill")
	}
}

// TestResumeNoLeak: resumed, diverged and refused continuations, over and
// over, leave no slot taken and no goroutine behind.
func TestResumeNoLeak(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(30)))
	b := newUpstream(t, deterministic(resumeB, true, 2))
	p := startProxy(t, resumeConfig(a, b, "30s"))
	run := func(body string) {
		resp := p.chat(body)
		_, _ = faultRead(resp)
	}
	const stream = `{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`
	run(stream) // warm up the connections' goroutines
	base := runtime.NumGoroutine()
	ok0, failed0 := p.resumes("ok"), p.resumes("failed")
	for i := 0; i < 10; i++ {
		run(stream)                                                                         // prefill rejected → replay → ok
		run(`{"model":"m","n":2,"messages":[{"role":"user","content":"x"}],"stream":true}`) // refused
	}
	if d := p.resumes("ok") - ok0; d != 10 {
		t.Errorf("resumes ok %v, want 10", d)
	}
	if d := p.resumes("failed") - failed0; d != 10 {
		t.Errorf("resumes failed %v, want 10", d)
	}
	faultEventually(t, 30*time.Second, "slots free and goroutines back", func() bool {
		return p.upstreamGauge("inflight", "a", "pa") == 0 && p.upstreamGauge("inflight", "b", "pb") == 0 &&
			runtime.NumGoroutine() <= base+3
	})
}

// TestResumeChained: the continuation breaks as well; the third upstream
// finishes from everything the client has by then.
func TestResumeChained(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(20)))
	// b continues from the prefill with 20 more tokens, then is cut.
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		var ev []string
		for _, tok := range resumeTokens[20:40] {
			ev = append(ev, resumeB.chunk(fmt.Sprintf(`{"content":%q}`, tok), ""))
		}
		faultChunkedCut(append([]string{resumeB.chunk(`{"role":"assistant","content":""}`, "")}, ev...))(w, r)
	})
	c := newUpstream(t, deterministic(resumeModel{"chatcmpl-third", 333, "real-c"}, false, 1))
	conf := resumeConfig(a, b, "30s")
	conf["providers"] = append(conf["providers"].([]map[string]any), obj("id", "pc", "url", c.base(), "probe_interval", "0s"))
	conf["upstreams"] = append(conf["upstreams"].([]map[string]any), obj("id", "c", "provider", "pc", "model", "real-c"))
	conf["models"] = []map[string]any{obj("name", "m", "upstreams", []string{"a", "b", "c"}, "resume", "on")}
	p := startProxy(t, conf)
	countResumed(t, p)
	calls := c.Calls()
	if len(calls) != 1 {
		t.Fatalf("third upstream got %d calls, want 1", len(calls))
	}
	wantPrefill(t, calls[0], 40) // what a and b delivered
	var hop bool
	for _, e := range p.logEntries("continuing stream") {
		hop = hop || e["from"] == "b" && e["to"] == "c"
	}
	if !hop {
		t.Error("no continuing stream log entry from b to c")
	}
}

// countParams is the resume tests' Messages request: "count", model m.
var countParams = anthropic.MessageNewParams{Model: "m", MaxTokens: 256,
	Messages: []anthropic.MessageParam{userText("count")}}
