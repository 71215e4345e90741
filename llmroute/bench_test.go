package llmroute

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// newBenchHandler provisions a Handler with a bare Caddy context (a unit-level
// test needs no server) in front of upstream.
func newBenchHandler(tb testing.TB, upstream string) *Handler {
	tb.Helper()
	raw := `{
		"providers": [{"id": "bench-p", "url": "` + upstream + `/v1", "key": "sk-bench",
			"patch": {"provider": {"allow_fallbacks": false}}}],
		"upstreams": [{"id": "bench-u", "provider": "bench-p", "model": "real-model", "max_concurrency": 64,
			"patch": {"provider": {"ignore": ["deepseek"]}}}],
		"models": [{"name": "m", "upstreams": ["bench-u"], "patch": {"reasoning": {"enabled": false}}}]
	}`
	return provisionBench(tb, raw)
}

// provisionBench provisions the handler config raw (JSON) the way
// newBenchHandler does.
func provisionBench(tb testing.TB, raw string) *Handler {
	tb.Helper()
	h := new(Handler)
	if err := json.Unmarshal([]byte(raw), h); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Cleanup() })
	// A bare context logs at DEBUG to stderr, which would be most of what is
	// measured. Log like a default Caddy instead (INFO, JSON), into nothing.
	// The prober has no upstream with a backoff here, so it has already
	// ended; the start-up path check (one GET of the model list) is waited
	// for, so nothing else reads the logger concurrently.
	<-h.proberDone
	<-h.pathChecks
	h.logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	return h
}

var benchCompletion = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"real-model",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}`)

var benchRequest = []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},` +
	`{"role":"user","content":"Hello there, how are you doing today?"}],"temperature":0.7,"max_tokens":256}`)

var nextNotCalled = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
	panic("next handler called for a chat completion")
})

// BenchmarkServeHTTP is the whole non-streaming request path in-process:
// parse, admit, rewrite the body, call the upstream, copy the answer back.
func BenchmarkServeHTTP(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchCompletion)
	}))
	defer up.Close()
	h := newBenchHandler(b, up.URL)

	serve := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchRequest))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil {
			b.Fatal(err)
		}
		return rec
	}
	if rec := serve(); rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), benchCompletion) {
		b.Fatalf("status %d body %s", rec.Code, rec.Body)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if rec := serve(); rec.Code != http.StatusOK {
			b.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
	}
}

// TestServeHTTPUnit runs the benchmark's set-up once as a test, so the
// unit-level path is checked by a plain `go test`.
func TestServeHTTPUnit(t *testing.T) {
	var got []byte
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the start-up path check's model list
			_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
			return
		}
		got, _ = io.ReadAll(r.Body)
		if a := r.Header.Get("Authorization"); a != "Bearer sk-bench" {
			t.Errorf("Authorization = %q", a)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-unit")
		_, _ = w.Write(benchCompletion)
	}))
	defer up.Close()
	h := newBenchHandler(t, up.URL)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchRequest))
	req.Header.Set("Authorization", "Bearer client")
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), benchCompletion) {
		t.Fatalf("status %d body %s", rec.Code, rec.Body)
	}
	if id := rec.Header().Get("X-Request-Id"); id != "req-unit" {
		t.Errorf("X-Request-Id = %q", id)
	}
	want := strings.Replace(string(benchRequest), `"model":"m"`, `"model":"real-model"`, 1)
	want = strings.TrimSuffix(want, "}") + `,"provider":{"allow_fallbacks":false,"ignore":["deepseek"]},"reasoning":{"enabled":false}}`
	if string(got) != want {
		t.Errorf("upstream body\n got %s\nwant %s", got, want)
	}
	if n := h.table.upstreams["bench-u"].State.Inflight(); n != 0 {
		t.Errorf("inflight %d after the request", n)
	}
}
