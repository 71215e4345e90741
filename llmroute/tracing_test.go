package llmroute

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestSpanAttributes calls the handler with a context carrying a recording
// span, as Caddy's tracing module gives it (its TracerProvider cannot be
// injected from a test), and checks the GenAI attributes on the exported span.
func TestSpanAttributes(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchCompletion)
	}))
	defer up.Close()
	h := newBenchHandler(t, up.URL)

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(t.Context()) }()
	ctx, span := tp.Tracer("test").Start(t.Context(), "request")
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchRequest)).WithContext(ctx)
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil {
		t.Fatal(err)
	}
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("spans = %d", len(spans))
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range spans[0].Attributes {
		got[kv.Key] = kv.Value
	}
	want := map[attribute.Key]any{
		"gen_ai.request.model":       "m",
		"gen_ai.response.model":      "real-model",
		"gen_ai.provider.name":       "bench-p",
		"llm_route.upstream":         "bench-u",
		"llm_route.attempts":         int64(1),
		"gen_ai.usage.input_tokens":  int64(9),
		"gen_ai.usage.output_tokens": int64(9),
	}
	for k, w := range want {
		if v, ok := got[k]; !ok || v.AsInterface() != w {
			t.Errorf("%s = %v, want %v", k, v.AsInterface(), w)
		}
	}
}
