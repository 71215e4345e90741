package integration

// Repeat guard (model repeat_guard on): an answer stuck in a loop is caught
// while it streams, the loop is dropped, and the answer goes on elsewhere
// (or ends with finish reason length), the client seeing one clean stream.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

var (
	loopA = resumeModel{"chatcmpl-loop-a", 333, "real-a"}
	loopB = resumeModel{"chatcmpl-loop-b", 444, "real-b"}
)

// loopRecovery is the text a recovering model goes on with.
const loopRecovery = " Let me answer differently: the value is 42."

// runeDeltas cuts text into deltas of n runes, as a token stream would.
func runeDeltas(text string, n int) []string {
	rs := []rune(text)
	var out []string
	for i := 0; i < len(rs); i += n {
		out = append(out, string(rs[i:min(i+n, len(rs))]))
	}
	return out
}

// chatEvents is a whole chat stream of m: a role chunk, one chunk per
// delta (in the reasoning_content member when reasoning), a finish chunk
// and [DONE].
func chatEvents(m resumeModel, reasoning bool, deltas []string, finish string) []string {
	key := "content"
	if reasoning {
		key = "reasoning_content"
	}
	ev := []string{m.chunk(`{"role":"assistant","content":""}`, "")}
	for _, d := range deltas {
		b, _ := json.Marshal(map[string]string{key: d})
		ev = append(ev, m.chunk(string(b), ""))
	}
	ev = append(ev, m.chunk(`{}`, finish))
	return append(ev, "data: [DONE]\n\n")
}

// looper answers with prefix then unit repeated reps times (till its
// max_tokens: finish reason length), in deltas of 8 runes.
func looper(m resumeModel, prefix, unit string, reps int, reasoning bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		text := prefix + strings.Repeat(unit, reps)
		if !wantsStream(r) {
			writeCompletion(w, m, text, reasoning, "length")
			return
		}
		writeStream(w, chatEvents(m, reasoning, runeDeltas(text, 8), "length"), 0)
	}
}

// wantsStream reads a chat request's stream flag (the body stays readable
// for the harness, which recorded it already).
func wantsStream(r *http.Request) bool {
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	return req.Stream
}

// writeCompletion answers a non-stream chat request.
func writeCompletion(w http.ResponseWriter, m resumeModel, text string, reasoning bool, finish string) {
	msg := map[string]any{"role": "assistant", "content": text}
	if reasoning {
		msg["content"], msg["reasoning_content"] = "", text
	}
	b, _ := json.Marshal(map[string]any{"id": m.id, "object": "chat.completion", "created": m.created, "model": m.model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]int{"prompt_tokens": 7, "completion_tokens": 100, "total_tokens": 107}})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// recoverer answers a continuation with loopRecovery (after reasoning of
// its own, which the client must not see).
func recoverer(m resumeModel) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !wantsStream(r) {
			writeCompletion(w, m, loopRecovery, false, "stop")
			return
		}
		ev := chatEvents(m, false, runeDeltas(loopRecovery, 8), "stop")
		think := m.chunk(`{"reasoning_content":"NEW THOUGHTS"}`, "")
		writeStream(w, append([]string{ev[0], think}, ev[1:]...), 0)
	}
}

// guardConfig is model "m" with repeat_guard on over upstreams "a" and "b",
// plus extra model fields.
func guardConfig(a, b *fakeUpstream, modelFields ...any) map[string]any {
	return cfg(
		[]map[string]any{
			obj("id", "pa", "url", a.base(), "probe_interval", "0s"),
			obj("id", "pb", "url", b.base(), "probe_interval", "0s"),
		},
		[]map[string]any{obj("id", "a", "provider", "pa", "model", "real-a"), obj("id", "b", "provider", "pb", "model", "real-b")},
		[]map[string]any{obj(append([]any{"name", "m", "upstreams", []string{"a", "b"}, "repeat_guard", "on"}, modelFields...)...)})
}

// guardedStream is what a client read of a chat stream: the text and
// reasoning, the finish reason, and the checks of one clean stream.
type guardedStream struct {
	content, reasoning string
	finish             string
	raw                string
}

// readGuarded reads a chat stream and checks it is one clean stream: one
// role chunk, exactly one [DONE] at the end, every chunk with the first
// upstream's id/created/model, no error event.
func readGuarded(t *testing.T, resp *http.Response, first resumeModel) guardedStream {
	t.Helper()
	body, err := faultRead(resp)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, read error %v; body %q", resp.StatusCode, err, tail(body, 300))
	}
	body, _ = faultStripKeepalives(t, body)
	if strings.Contains(body, `"error"`) {
		t.Fatalf("error event: %q", tail(body, 300))
	}
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	if events[len(events)-1] != "data: [DONE]" || strings.Count(body, "data: [DONE]") != 1 {
		t.Fatalf("stream does not end with exactly one [DONE]: %q", tail(body, 300))
	}
	g := guardedStream{raw: body}
	roles := 0
	for _, ev := range events[:len(events)-1] {
		payload, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("not a data event: %q", ev)
		}
		var ch struct {
			ID      string `json:"id"`
			Created int    `json:"created"`
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Role             string `json:"role"`
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(payload), &ch); err != nil {
			t.Fatalf("chunk %q: %v", payload, err)
		}
		if ch.ID != first.id || ch.Created != first.created || ch.Model != first.model {
			t.Errorf("chunk id/created/model %s/%d/%s, want the first upstream's %s/%d/%s", ch.ID, ch.Created, ch.Model, first.id, first.created, first.model)
		}
		for _, c := range ch.Choices {
			if c.Delta.Role != "" {
				roles++
			}
			g.content += c.Delta.Content
			g.reasoning += c.Delta.ReasoningContent
			if c.FinishReason != nil {
				g.finish = *c.FinishReason
			}
		}
	}
	if roles != 1 {
		t.Errorf("%d role chunks, want 1", roles)
	}
	return g
}

// repeats is llm_proxy_repeat_guard_total of model m on upstream a.
func (p *proxy) repeats(result string) float64 {
	return p.repeatsOn("a", result)
}

func (p *proxy) repeatsOn(upstream, result string) float64 {
	return p.metric("llm_proxy_repeat_guard_total", "model", "m", "upstream", upstream, "result", result)
}

// TestRepeatGuardCatchesLoops: a sentence repeated 40 times, a one-rune
// loop, a CJK loop and a loop inside the reasoning are each caught within
// repeat_min_span runes of the run's start; the client sees at most that
// much of it, then the next upstream's answer, stitched into one stream.
func TestRepeatGuardCatchesLoops(t *testing.T) {
	const minSpan = 400
	for _, tc := range []struct {
		name, prefix, unit string
		reps               int
		reasoning          bool
	}{
		{"sentence x40", "Here is what I found. ", "The file is in the config directory, next to the main module. ", 40, false},
		{"one rune", "Wow", "!", 3000, false},
		{"cjk", "答案如下：", "我不知道这个问题。", 300, false},
		{"in reasoning", "Let me think about the request. ", "I should check the file again. ", 60, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newUpstream(t, looper(loopA, tc.prefix, tc.unit, tc.reps, tc.reasoning))
			b := newUpstream(t, recoverer(loopB))
			p := startProxy(t, guardConfig(a, b))
			rec0 := p.repeats("recovered")
			resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"where is the file?"}],"stream":true}`)
			g := readGuarded(t, resp, loopA)
			if g.finish != "stop" {
				t.Errorf("finish_reason %q, want stop (the recovery's)", g.finish)
			}
			looped, rest := g.content, loopRecovery
			if tc.reasoning {
				looped = g.reasoning
				if g.content != loopRecovery || strings.Contains(g.reasoning, "NEW THOUGHTS") {
					t.Errorf("content %q reasoning %q: want the recovery's answer without its reasoning", g.content, tail(g.reasoning, 80))
				}
				rest = ""
			}
			seen, ok := strings.CutSuffix(looped, rest)
			if !ok || !strings.HasPrefix(seen, tc.prefix) {
				t.Fatalf("client text %q: want the prefix, part of the loop, then the recovery", tail(looped, 200))
			}
			run := strings.TrimPrefix(seen, tc.prefix)
			if n := utf8.RuneCountInString(run); n > minSpan || !strings.HasPrefix(strings.Repeat(tc.unit, 20), run) || !strings.HasPrefix(run, tc.unit) {
				t.Errorf("the client saw %d runes of the loop (%q): want at least one copy of the unit and at most %d runes", n, tail(run, 80), minSpan)
			}
			if d := p.repeats("recovered") - rec0; d != 1 {
				t.Errorf("llm_proxy_repeat_guard_total recovered went up by %v, want 1", d)
			}
			calls := b.Calls()
			if len(calls) != 1 {
				t.Fatalf("recovery calls %d, want 1", len(calls))
			}
			var req struct {
				Temperature      *float64 `json:"temperature"`
				FrequencyPenalty *float64 `json:"frequency_penalty"`
			}
			_ = json.Unmarshal(calls[0].Body, &req)
			if req.Temperature == nil || *req.Temperature != 1.0 || req.FrequencyPenalty == nil || *req.FrequencyPenalty != 0.5 {
				t.Errorf("recovery sampling %s: want temperature 1 (0.7 + 0.3) and frequency_penalty 0.5", calls[0].Body)
			}
			prefill, isPrefill := lastAssistant(calls[0].Body)
			if tc.reasoning {
				if isPrefill {
					t.Errorf("a reasoning loop with no content yet was continued with a prefill %q", prefill)
				}
			} else if !isPrefill || prefill != seen {
				t.Errorf("recovery prefill %q (assistant message %v), want the text the client has %q", tail(prefill, 80), isPrefill, tail(seen, 80))
			}
			// The log line names the unit and the span.
			if logs := p.logs(); !strings.Contains(logs, "answer stuck in a loop") || !strings.Contains(logs, `"span":`) {
				t.Errorf("no loop log line with the span")
			}
			if os.Getenv("LLMROUTE_SHOW_LOOP") != "" {
				t.Logf("client stream:\n%s", g.raw)
			}
		})
	}
}

// TestRepeatGuardSameUpstream: with one upstream, the recovery goes to the
// same one, and the sampling of a request that set its own is kept in
// bounds: temperature 1.4 becomes 1.5, its frequency_penalty stays.
func TestRepeatGuardSameUpstream(t *testing.T) {
	var calls atomic.Int32
	loop := looper(loopA, "Answer: ", "again and again ", 200, false)
	rec := recoverer(loopA)
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			loop(w, r)
			return
		}
		rec(w, r)
	})
	conf := cfg([]map[string]any{obj("id", "pa", "url", a.base(), "probe_interval", "0s")},
		[]map[string]any{obj("id", "a", "provider", "pa", "model", "real-a")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"a"}, "repeat_guard", "on")})
	p := startProxy(t, conf)
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"temperature":1.4,"frequency_penalty":0.1}`)
	g := readGuarded(t, resp, loopA)
	if !strings.HasSuffix(g.content, loopRecovery) || g.finish != "stop" {
		t.Fatalf("content %q finish %q", tail(g.content, 100), g.finish)
	}
	cs := a.Calls()
	if len(cs) != 2 {
		t.Fatalf("%d calls, want 2 (the loop, then the recovery on the same upstream)", len(cs))
	}
	var req struct {
		Temperature      float64 `json:"temperature"`
		FrequencyPenalty float64 `json:"frequency_penalty"`
	}
	_ = json.Unmarshal(cs[1].Body, &req)
	if req.Temperature != 1.5 || req.FrequencyPenalty != 0.1 {
		t.Errorf("recovery temperature %v frequency_penalty %v, want 1.5 (capped) and the request's 0.1", req.Temperature, req.FrequencyPenalty)
	}
}

// TestRepeatGuardExhausted: both upstreams loop; after the one recovery
// the answer ends with what was delivered and finish_reason length, and
// the metric says cut. With repeat_recoveries 0 it ends at the first loop.
func TestRepeatGuardExhausted(t *testing.T) {
	a := newUpstream(t, looper(loopA, "First: ", "round and round ", 200, false))
	b := newUpstream(t, looper(loopB, "", "round and round ", 200, false))
	p := startProxy(t, guardConfig(a, b))
	cutA0, cutB0 := p.repeats("cut"), p.repeatsOn("b", "cut")
	g := readGuarded(t, p.chat(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`), loopA)
	if g.finish != "length" {
		t.Errorf("finish_reason %q, want length", g.finish)
	}
	if n := utf8.RuneCountInString(g.content); n > 2*400 {
		t.Errorf("the client got %d runes of two loops", n)
	}
	if d := p.repeatsOn("b", "cut") - cutB0; d != 1 {
		t.Errorf("cut on b went up by %v, want 1", d)
	}
	if d := p.repeats("cut") - cutA0; d != 0 {
		t.Errorf("cut on a went up by %v, want 0 (a's loop was recovered)", d)
	}

	t.Run("no recoveries", func(t *testing.T) {
		p.load(guardConfig(a, b, "repeat_recoveries", 0))
		n := len(b.Calls())
		cut0 := p.repeats("cut")
		g := readGuarded(t, p.chat(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`), loopA)
		if g.finish != "length" || !strings.HasPrefix(g.content, "First: round and round ") {
			t.Errorf("finish %q content %q", g.finish, tail(g.content, 80))
		}
		if len(b.Calls()) != n {
			t.Error("a recovery was sent with repeat_recoveries 0")
		}
		if d := p.repeats("cut") - cut0; d != 1 {
			t.Errorf("cut went up by %v, want 1", d)
		}
	})
}

// TestRepeatGuardNearMisses: text that repeats without looping passes
// untouched, byte for byte as with the guard off.
func TestRepeatGuardNearMisses(t *testing.T) {
	table := "| name | value |\n|------|-------|\n" + strings.Repeat("| a    | 1     |\n", 12)
	list := ""
	for i := range 30 {
		list += fmt.Sprintf("- step %d: run the check again\n", i+1)
	}
	code := "```go\nfunc f() {\n" + strings.Repeat("\tif x {\n", 8) + "\t\ty()\n" + strings.Repeat("\t}\n", 8) + "}\n```\n" + strings.Repeat("}", 40) + "\n"
	haha := "He laughed: ha ha ha ha ha ha ha ha ha ha. Then he left."
	rule := strings.Repeat("=", 120) + "\nTitle\n" + strings.Repeat("=", 120) + "\n"
	for _, tc := range []struct{ name, text string }{
		{"markdown table", table}, {"list of similar lines", list}, {"code with braces", code}, {"ha ha ha", haha}, {"rules", rule},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				writeStream(w, chatEvents(loopA, false, runeDeltas(tc.text, 3), "stop"), 0)
			})
			on := startProxy(t, guardConfig(up, up))
			got := readGuarded(t, on.chat(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`), loopA)
			if got.content != tc.text || got.finish != "stop" {
				t.Fatalf("content %q finish %q, want the text untouched", got.content, got.finish)
			}
			off := guardConfig(up, up)
			off["models"].([]map[string]any)[0]["repeat_guard"] = "off"
			on.load(off)
			want := readGuarded(t, on.chat(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`), loopA)
			if got.raw != want.raw {
				t.Errorf("the stream differs from the one with the guard off:\n%s\nvs\n%s", tail(got.raw, 300), tail(want.raw, 300))
			}
		})
	}
}

// TestRepeatGuardNoDelay: a 2,000-word answer with no loop reaches the
// client delta for delta as the upstream sent it: each delta's delay from
// the upstream's write to the client's read is, in the median, within 2
// ms of the same run with the guard off.
func TestRepeatGuardNoDelay(t *testing.T) {
	// Words drawn at random (a fixed seed): prose that never loops.
	vocab := strings.Fields("the proxy routes each request to an upstream model and streams answer back while it watches for loops in text; a client reads every delta, then acts on what it got. GPU time is scarce")
	rng := rand.New(rand.NewPCG(29, 29))
	words := make([]string, 2000)
	for i := range words {
		words[i] = vocab[rng.IntN(len(vocab))]
	}
	sent := make([]time.Time, len(words))
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		fmt.Fprint(w, loopA.chunk(`{"role":"assistant","content":""}`, ""))
		_ = rc.Flush()
		for i, wd := range words {
			b, _ := json.Marshal(map[string]string{"content": wd + " "})
			sent[i] = time.Now()
			fmt.Fprint(w, loopA.chunk(string(b), ""))
			_ = rc.Flush()
			time.Sleep(time.Millisecond)
		}
		fmt.Fprint(w, loopA.chunk(`{}`, "stop"), "data: [DONE]\n\n")
	})
	// delays reads the stream, noting when each content delta arrived,
	// and returns each delta's delay after the upstream wrote it.
	delays := func(p *proxy) []time.Duration {
		resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var out []time.Duration
		var text strings.Builder
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, `"content":"`) || strings.Contains(line, `"role"`) {
				continue
			}
			at := time.Now()
			var ch struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ch)
			if len(ch.Choices) != 1 || ch.Choices[0].Delta.Content != words[len(out)]+" " {
				t.Fatalf("delta %d is %q, want %q: not delta for delta", len(out), line, words[len(out)]+" ")
			}
			text.WriteString(ch.Choices[0].Delta.Content)
			out = append(out, at.Sub(sent[len(out)]))
		}
		if len(out) != len(words) {
			t.Fatalf("%d deltas, want %d", len(out), len(words))
		}
		return out
	}
	median := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	p := startProxy(t, guardConfig(up, up))
	on := median(delays(p))
	off := guardConfig(up, up)
	off["models"].([]map[string]any)[0]["repeat_guard"] = "off"
	p.load(off)
	offD := median(delays(p))
	t.Logf("median delay per delta: guard on %v, off %v", on, offD)
	if on-offD > 2*time.Millisecond {
		t.Errorf("median delay per delta with the guard on %v, off %v: more than 2ms apart", on, offD)
	}
}

// TestRepeatGuardConfig: the repeat_* fields are checked, naming the
// model.
func TestRepeatGuardConfig(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	for _, tc := range []struct {
		fields []any
		want   string
	}{
		{[]any{"repeat_guard", "yes"}, `model "m": repeat_guard: want on or off, got "yes"`},
		{[]any{"repeat_guard", "on", "repeat_min_span", 8}, `model "m": repeat_min_span must be between 16 and`},
		{[]any{"repeat_guard", "on", "repeat_max_period", 300}, `model "m": repeat_max_period must be between 1 and 256`},
		{[]any{"repeat_guard", "on", "repeat_min_span", 100, "repeat_max_period", 60}, `model "m": repeat_max_period (60) must be at most half of repeat_min_span (100)`},
		{[]any{"repeat_guard", "on", "repeat_recoveries", 4}, `model "m": repeat_recoveries must be between 0 and 3, got 4`},
		{[]any{"repeat_guard", "on", "repeat_recoveries", -1}, `model "m": repeat_recoveries must be between 0 and 3, got -1`},
	} {
		conf := basicConfig(up, 0)
		conf["models"] = []any{obj(append([]any{"name", "m", "upstreams", []string{"u1"}}, tc.fields...)...)}
		if err := p.loadErr(conf); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: load error %v, want %q", tc.fields, err, tc.want)
		}
	}
	conf := basicConfig(up, 0)
	conf["models"] = []any{obj("name", "m", "upstreams", []string{"u1"}, "repeat_guard", "on", "repeat_min_span", 100)}
	if err := p.loadErr(conf); err != nil {
		t.Errorf("repeat_min_span 100 with the default period: %v (the period defaults to half the span)", err)
	}
}

// TestRepeatGuardRecordedClients: Claude Code's and Codex's recorded
// requests through the translated Messages and Responses fronts. A loop
// that is recovered ends as a normal turn; one with no recovery left ends
// as cut off at the token limit, in the front's own terms: stop_reason
// max_tokens, status incomplete (max_output_tokens). Either way one clean
// stream of the front.
func TestRepeatGuardRecordedClients(t *testing.T) {
	type recorded struct {
		Requests []struct {
			URL     string            `json:"url"`
			Headers map[string]string `json:"headers"`
			Body    json.RawMessage   `json:"body"`
		} `json:"requests"`
	}
	a := newUpstream(t, looper(loopA, "Plan: ", "I will write the file now. ", 100, false))
	var recover atomic.Bool
	loopOnB := looper(loopB, "", "I will write the file now. ", 100, false)
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if recover.Load() {
			recoverer(loopB)(w, r)
			return
		}
		loopOnB(w, r)
	})
	p := startProxy(t, guardConfig(a, b))
	for _, tc := range []struct {
		name, file, path string
		start, end       string // the front's first and final event names
		cut, done        string // what the final event says when cut, when recovered
	}{
		{"claude code", "claude-code-2.1.328.messages.json", "/v1/messages", "event: message_start", "event: message_stop",
			`"stop_reason":"max_tokens"`, `"stop_reason":"end_turn"`},
		{"codex", "codex-0.169.0.responses.json", "/v1/responses", "event: response.created", "event: response.",
			`"incomplete_details":{"reason":"max_output_tokens"}`, `"status":"completed"`},
	} {
		raw, err := os.ReadFile("testdata/clients/" + tc.file)
		if err != nil {
			t.Fatal(err)
		}
		var rec recorded
		if err := json.Unmarshal(raw, &rec); err != nil || len(rec.Requests) == 0 {
			t.Fatalf("%s: %v", tc.file, err)
		}
		q := rec.Requests[len(rec.Requests)-1]
		var body map[string]any
		_ = json.Unmarshal(q.Body, &body)
		body["model"], body["stream"] = "m", true
		send := func(t *testing.T) string {
			bb, _ := json.Marshal(body)
			req, _ := http.NewRequest(http.MethodPost, p.URL+tc.path, strings.NewReader(string(bb)))
			for k, v := range q.Headers {
				if !strings.EqualFold(k, "content-length") && !strings.EqualFold(k, "host") && !strings.EqualFold(k, "accept-encoding") {
					req.Header.Set(k, v)
				}
			}
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			out, err := faultRead(resp)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, read error %v: %s", resp.StatusCode, err, tail(out, 300))
			}
			if strings.Contains(out, "event: error") || strings.Contains(out, "response.failed") {
				t.Fatalf("error event: %s", tail(out, 300))
			}
			if strings.Count(out, tc.start+"\n") != 1 {
				t.Errorf("%d %q events, want 1", strings.Count(out, tc.start+"\n"), tc.start)
			}
			return out
		}
		t.Run(tc.name+" cut", func(t *testing.T) {
			recover.Store(false)
			cut0 := p.repeatsOn("b", "cut")
			out := send(t)
			if !strings.Contains(out, tc.cut) || tc.path == "/v1/responses" && !strings.Contains(out, `"status":"incomplete"`) {
				t.Errorf("the final event does not say %s: %s", tc.cut, tail(out, 600))
			}
			if d := p.repeatsOn("b", "cut") - cut0; d != 1 {
				t.Errorf("cut went up by %v, want 1", d)
			}
		})
		t.Run(tc.name+" recovered", func(t *testing.T) {
			recover.Store(true)
			out := send(t)
			if !strings.Contains(out, tc.done) || !strings.Contains(out, ` 42.`) {
				t.Errorf("the answer does not end as recovered (%s): %s", tc.done, tail(out, 600))
			}
		})
	}
}

// TestRepeatGuardWhole: a non-stream answer is checked whole before it goes
// out: a loop is cut after one copy of its unit and the answer continued
// (one more attempt in X-LLM-Route-Attempts), or, with no recovery left,
// ends there with finish_reason length (Messages: stop_reason max_tokens).
func TestRepeatGuardWhole(t *testing.T) {
	const prefix, unit = "The answer: ", "it is in the file, "
	a := newUpstream(t, looper(loopA, prefix, unit, 80, false))
	b := newUpstream(t, recoverer(loopB))
	p := startProxy(t, guardConfig(a, b))
	rec0 := p.repeats("recovered")
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	var out struct {
		ID      string `json:"id"`
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
	}
	body := readAll(t, resp)
	if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("answer %s: %v", body, err)
	}
	// The run starts one rune early (the prefix ends with the space the
	// unit ends with), so one copy of its unit ends before that space.
	const kept = prefix + "it is in the file,"
	if got := out.Choices[0].Message.Content; got != kept+loopRecovery || out.Choices[0].FinishReason != "stop" || out.ID != loopA.id {
		t.Errorf("answer %q (%s, id %s), want the prefix, one copy of the unit, then the recovery", got, out.Choices[0].FinishReason, out.ID)
	}
	if n := resp.Header.Get("X-LLM-Route-Attempts"); n != "2" {
		t.Errorf("X-LLM-Route-Attempts %q, want 2 (the recovery is an attempt)", n)
	}
	if d := p.repeats("recovered") - rec0; d != 1 {
		t.Errorf("recovered went up by %v, want 1", d)
	}
	if prefill, ok := lastAssistant(b.Calls()[0].Body); !ok || prefill != kept {
		t.Errorf("recovery prefill %q (%v), want %q", prefill, ok, kept)
	}

	t.Run("exhausted", func(t *testing.T) {
		p.load(guardConfig(a, b, "repeat_recoveries", 0))
		cut0 := p.repeats("cut")
		body := readAll(t, p.chat(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
		_ = json.Unmarshal([]byte(body), &out)
		if len(out.Choices) != 1 || out.Choices[0].Message.Content != kept || out.Choices[0].FinishReason != "length" {
			t.Errorf("answer %s: want the text up to one copy, finish_reason length", body)
		}
		if d := p.repeats("cut") - cut0; d != 1 {
			t.Errorf("cut went up by %v, want 1", d)
		}
		req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/messages", strings.NewReader(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"x"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if msg := readAll(t, resp); !strings.Contains(msg, `"stop_reason":"max_tokens"`) || !strings.Contains(msg, kept+`"`) {
			t.Errorf("Messages answer %s: want the text up to one copy and stop_reason max_tokens", msg)
		}
	})
}

// TestRepeatGuardAfterResume: with resume on too, a stream that breaks is
// continued on b, whose continuation loops; the guard's recovery takes
// over (on b again, the last of the chain), that loops as well and the
// answer ends with finish_reason length. One clean stream, and every slot
// free afterwards, many times over.
func TestRepeatGuardAfterResume(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(10)))
	b := newUpstream(t, looper(loopB, "", "over and over ", 200, false))
	conf := guardConfig(a, b, "resume", "on")
	p := startProxy(t, conf)
	rec0, cut0 := p.repeatsOn("b", "recovered"), p.repeatsOn("b", "cut")
	base := runtime.NumGoroutine()
	for range 10 {
		g := readGuarded(t, p.chat(`{"model":"m","messages":[{"role":"user","content":"count"}],"stream":true}`), resumeA)
		if g.finish != "length" || !strings.HasPrefix(g.content, strings.Join(resumeTokens[:10], "")+"over and over ") {
			t.Fatalf("finish %q content %q: want the delivered tokens, the loop cut, finish length", g.finish, tail(g.content, 120))
		}
	}
	if d := p.repeatsOn("b", "recovered") - rec0; d != 10 {
		t.Errorf("recovered on b went up by %v, want 10", d)
	}
	if d := p.repeatsOn("b", "cut") - cut0; d != 10 {
		t.Errorf("cut on b went up by %v, want 10", d)
	}
	faultEventually(t, 30*time.Second, "slots free and goroutines back", func() bool {
		return p.upstreamGauge("inflight", "a", "pa") == 0 && p.upstreamGauge("inflight", "b", "pb") == 0 &&
			runtime.NumGoroutine() <= base+3
	})
}

// TestRepeatGuardGeminiCLI: Gemini CLI's recorded streamed turn through the
// Gemini front translated from chat: a loop with no recovery left ends
// with finishReason MAX_TOKENS, no error; a recovered one ends with STOP.
func TestRepeatGuardGeminiCLI(t *testing.T) {
	raw, err := os.ReadFile("testdata/clients/gemini-cli-0.61.0.generatecontent.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec recordedCLI
	if err := json.Unmarshal(raw, &rec); err != nil || len(rec.Requests) < 2 {
		t.Fatalf("recorded requests: %v", err)
	}
	q := rec.Requests[len(rec.Requests)-1]
	a := newUpstream(t, looper(loopA, "Plan: ", "I will write the file now. ", 100, false))
	var recover atomic.Bool
	loopB := looper(loopB, "", "I will write the file now. ", 100, false)
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if recover.Load() {
			recoverer(resumeB)(w, r)
			return
		}
		loopB(w, r)
	})
	conf := guardConfig(a, b)
	conf["models"].([]map[string]any)[0]["name"] = "gemini-3.8-flash"
	p := startProxy(t, conf)
	send := func(t *testing.T) string {
		var compact bytes.Buffer
		_ = json.Compact(&compact, q.Body)
		req, _ := http.NewRequest(q.Method, p.URL+q.URL, strings.NewReader(compact.String()))
		for k, v := range q.Headers {
			if !strings.EqualFold(k, "content-length") && !strings.EqualFold(k, "host") && !strings.EqualFold(k, "accept-encoding") {
				req.Header.Set(k, v)
			}
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, err := faultRead(resp)
		if err != nil || resp.StatusCode != http.StatusOK || strings.Contains(out, `"error"`) {
			t.Fatalf("status %d, read error %v: %s", resp.StatusCode, err, tail(out, 300))
		}
		return out
	}
	if out := send(t); !strings.Contains(out, `"finishReason":"MAX_TOKENS"`) {
		t.Errorf("cut: no MAX_TOKENS: %s", tail(out, 400))
	}
	recover.Store(true)
	if out := send(t); !strings.Contains(out, `"finishReason":"STOP"`) || !strings.Contains(out, "42.") {
		t.Errorf("recovered: %s", tail(out, 400))
	}
}
