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

// TestRuleSpanAttributes: a router model request's span names the router
// model, the rule, the effort and its source, and the model of the chain
// that answered; a plain model's span has none of the rule attributes.
func TestRuleSpanAttributes(t *testing.T) {
	h := provisionBench(t, routerConfig(modelListServer(t).URL, 3))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(t.Context()) }()
	for _, model := range []string{"auto:high", "m"} {
		ctx, span := tp.Tracer("test").Start(t.Context(), "request")
		body := bytes.Replace(benchRequest, []byte(`"model":"m"`), []byte(`"model":"`+model+`","user":"u-1"`), 1)
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)).WithContext(ctx)
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("%s: %v %d %s", model, err, rec.Code, rec.Body)
		}
		span.End()
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("spans = %d", len(spans))
	}
	attrs := func(i int) map[attribute.Key]any {
		got := map[attribute.Key]any{}
		for _, kv := range spans[i].Attributes {
			got[kv.Key] = kv.Value.AsInterface()
		}
		return got
	}
	got := attrs(0)
	chain := got["llm_route.chain_model"]
	if got["gen_ai.request.model"] != "auto" || got["llm_route.rule"] != "anything-else" || got["llm_route.effort"] != "high" ||
		got["llm_route.effort_source"] != "suffix" || (chain != "m" && chain != "m2") {
		t.Errorf("router span attributes %v", got)
	}
	if plain := attrs(1); plain["llm_route.rule"] != nil || plain["gen_ai.request.model"] != "m" {
		t.Errorf("plain span attributes %v", plain)
	}
}
