package integration

import (
	"testing"
)

// TestRouteHeadersEditedInPlace: Caddy's header handler rewrites response
// header values in place (`replace`, deferred). The route headers of one
// answer must therefore not share their value slices with other answers, or
// each edit would pile up on the next response.
func TestRouteHeadersEditedInPlace(t *testing.T) {
	gpu := newUpstream(t, completion("from gpu"))
	cloud := newUpstream(t, completion("from cloud"))
	p := startProxy(t, twoUpstreams(gpu, cloud))
	h := map[string]any{"handler": "llm_route"}
	for k, v := range twoUpstreams(gpu, cloud) {
		h[k] = v
	}
	replace := []any{obj("search_regexp", "^", "replace", ">")}
	headers := obj("handler", "headers", "response", obj("deferred", true,
		"replace", obj("X-Llm-Route-Upstream", replace, "X-Llm-Route-Attempts", replace)))
	if err := p.loadRoutes([]any{obj("handle", []any{headers, h})}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		resp := p.chat(`{"model":"m","messages":[]}`)
		readAll(t, resp)
		up, att := resp.Header.Get("X-LLM-Route-Upstream"), resp.Header.Get("X-LLM-Route-Attempts")
		if resp.StatusCode != 200 || up != ">gpu" || att != ">1" {
			t.Fatalf("request %d: status %d upstream %q attempts %q, want 200 >gpu >1", i, resp.StatusCode, up, att)
		}
	}
}
