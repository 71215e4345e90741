package integration

// The harness runs a real Caddy in this test process (caddy.Load, the same
// path as the admin API's /load) with the llm_route module, and fake
// upstream servers that behave like real providers: real SSE framing, real
// status codes, hangs, resets. Tests in this package run one at a time: they
// share the process-wide Caddy instance.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llm-route/caddy-llm-route"
)

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// proxy is a running Caddy with one llm_route handler.
type proxy struct {
	t       testing.TB
	URL     string // http://127.0.0.1:port
	admin   string // http://127.0.0.1:port of the admin API
	logPath string
	port    int
	aport   int
}

// startProxy loads a Caddy config whose only route is the given llm_route
// handler JSON (an object without "handler"). It is stopped when the test
// ends.
func startProxy(t testing.TB, handler map[string]any) *proxy {
	t.Helper()
	p := &proxy{t: t, port: freePort(t), aport: freePort(t)}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	p.admin = fmt.Sprintf("http://127.0.0.1:%d", p.aport)
	p.logPath = filepath.Join(t.TempDir(), "caddy.log")
	p.load(handler)
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping caddy: %v", err)
		}
	})
	return p
}

// config renders the whole Caddy config around a handler.
func (p *proxy) config(handler map[string]any) []byte {
	h := map[string]any{"handler": "llm_route"}
	for k, v := range handler {
		h[k] = v
	}
	cfg := map[string]any{
		"admin": map[string]any{"listen": fmt.Sprintf("127.0.0.1:%d", p.aport)},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"level":  "DEBUG",
			"writer": map[string]any{"output": "file", "filename": p.logPath},
		}}},
		"apps": map[string]any{"http": map[string]any{
			"grace_period": "1ns",
			"servers": map[string]any{"srv0": map[string]any{
				"listen":          []string{fmt.Sprintf("127.0.0.1:%d", p.port)},
				"automatic_https": map[string]any{"disable": true},
				"metrics":         map[string]any{},
				"routes":          []any{map[string]any{"handle": []any{h}}},
			}},
		}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

// load (re)loads the config, forcing a reload even if unchanged.
func (p *proxy) load(handler map[string]any) {
	p.t.Helper()
	if err := caddy.Load(p.config(handler), true); err != nil {
		p.t.Fatalf("loading config: %v", err)
	}
}

// loadErr loads a config and returns the error.
func (p *proxy) loadErr(handler map[string]any) error {
	return caddy.Load(p.config(handler), true)
}

// logs returns everything Caddy logged so far.
func (p *proxy) logs() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// chat posts a chat completion request body and returns the response.
func (p *proxy) chat(body string, hdr ...string) *http.Response {
	p.t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatalf("POST chat: %v", err)
	}
	return resp
}

// metrics returns the admin /metrics text.
func (p *proxy) metrics() string {
	p.t.Helper()
	resp, err := http.Get(p.admin + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue finds one sample in the metrics text, e.g.
// metricValue(`llm_proxy_upstream_inflight{provider="p",upstream="u"}`).
func (p *proxy) metricValue(series string) (float64, bool) {
	for _, line := range strings.Split(p.metrics(), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}

// readAll reads and closes a response body.
func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---- fake upstream ----

// upstreamCall is one request a fake upstream received.
type upstreamCall struct {
	Path   string
	Header http.Header
	Body   []byte
}

// fakeUpstream is an OpenAI-compatible server whose behaviour each test
// scripts. It records every call and its own peak concurrency.
type fakeUpstream struct {
	*httptest.Server
	mu       sync.Mutex
	calls    []upstreamCall
	handler  http.HandlerFunc
	inflight atomic.Int64
	peak     atomic.Int64
}

// newUpstream starts a fake upstream; behave answers each request (nil =
// a normal completion, streaming or not as the request asks).
func newUpstream(t testing.TB, behave http.HandlerFunc) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{handler: behave}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.inflight.Add(1)
		defer f.inflight.Add(-1)
		for {
			p := f.peak.Load()
			if n <= p || f.peak.CompareAndSwap(p, n) {
				break
			}
		}
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.calls = append(f.calls, upstreamCall{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
		h := f.handler
		f.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if h == nil {
			h = completion("hello")
		}
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

// setHandler swaps the behaviour.
func (f *fakeUpstream) setHandler(h http.HandlerFunc) {
	f.mu.Lock()
	f.handler = h
	f.mu.Unlock()
}

// Calls returns a copy of the calls so far.
func (f *fakeUpstream) Calls() []upstreamCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]upstreamCall(nil), f.calls...)
}

// base is the provider URL for this upstream.
func (f *fakeUpstream) base() string { return f.URL + "/v1" }

// isStream reports whether a request body asks for a stream.
func isStream(r *http.Request) bool {
	b, _ := io.ReadAll(r.Body)
	var v struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(b, &v)
	return v.Stream
}

// completion answers like a provider: a chat.completion, or an SSE stream
// of chunks ending in [DONE] when the request streams.
func completion(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if isStream(r) {
			writeStream(w, sseChunks(text), 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-123")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, text)
	}
}

// sseChunks splits text into one chunk event per word.
func sseChunks(text string) []string {
	var events []string
	for i, word := range strings.SplitAfter(text, " ") {
		role := ""
		if i == 0 {
			role = `"role":"assistant",`
		}
		events = append(events, fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{%s"content":%q},"finish_reason":null}]}`+"\n\n", role, word))
	}
	events = append(events, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
	return append(events, "data: [DONE]\n\n")
}

// writeStream sends SSE events, flushing each, gap apart.
func writeStream(w http.ResponseWriter, events []string, gap time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for _, ev := range events {
		if _, err := io.WriteString(w, ev); err != nil {
			return
		}
		_ = rc.Flush()
		if gap > 0 {
			time.Sleep(gap)
		}
	}
}

// status answers every request with code and an error body.
func status(code int, hdr ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":{"message":"upstream says %d","type":"upstream"}}`, code)
	}
}

// hang never answers until the client goes away (or release is closed).
func hang(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
}

// resetAfter writes part of a stream then kills the TCP connection.
func resetAfter(events []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, events, 0)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		conn.Close()
	}
}

// readSSE reads an SSE body and returns the data payloads.
func readSSE(t testing.TB, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// basicConfig is one provider, one upstream (limit), one model.
func basicConfig(up *fakeUpstream, limit int) map[string]any {
	return map[string]any{
		"providers": []any{map[string]any{"id": "p1", "url": up.base(), "key": "sk-test-secret-1"}},
		"upstreams": []any{map[string]any{"id": "u1", "provider": "p1", "model": "real-model", "max_concurrency": limit}},
		"models":    []any{map[string]any{"name": "m", "upstreams": []string{"u1"}}},
	}
}
