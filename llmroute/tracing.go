package llmroute

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// annotateSpan sets the OpenTelemetry GenAI attributes on the request's
// span, which Caddy's `tracing` directive starts; without it the span is a
// no-op and nothing is done.
//
// gen_ai.response.model is the model name the proxy sent upstream (the
// upstream's `model`): the response body is not parsed for it.
func annotateSpan(r *http.Request, rt *route, t *target, res attemptResult, attempts int) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	u := t.up
	span.SetAttributes(
		attribute.String("gen_ai.request.model", rt.name),
		attribute.String("gen_ai.response.model", u.model),
		attribute.String("gen_ai.provider.name", u.Provider),
		attribute.String("llm_route.upstream", u.ID),
		attribute.Int("llm_route.attempts", attempts),
	)
	if res.rule != nil {
		span.SetAttributes(
			attribute.String("llm_route.rule", res.rule.name),
			attribute.String("llm_route.effort", res.effort.String()),
			attribute.String("llm_route.effort_source", res.effortSrc.String()),
			attribute.String("llm_route.chain_model", t.model),
		)
	}
	if res.usage.Seen {
		span.SetAttributes(
			attribute.Int64("gen_ai.usage.input_tokens", res.usage.Input),
			attribute.Int64("gen_ai.usage.output_tokens", res.usage.Output),
		)
	}
}
