package llmroute

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/wire/gemini"
)

// serveGeminiCount answers POST …/models/{model}:countTokens as
// count_tokens is answered: no generation slot, never a chat upstream (a
// paid fallback would be sent the whole prompt for nothing); the first
// non-cooling upstream serving Gemini natively counts, its answer passed
// through; when there is none, or it fails, the proxy estimates, saying so
// in X-LLM-Route-Estimate.
func (h *Handler) serveGeminiCount(w http.ResponseWriter, r *http.Request, key *clientKey, model string) error {
	const f = frontGeminiCount
	bodyBuf := getBuffer()
	defer putBuffer(bodyBuf)
	body, apiErr := readBody(r, h.maxBody, bodyBuf)
	if apiErr != nil {
		h.refuse(w, r, f, *apiErr)
		return nil
	}
	// Estimated first: it also checks the body is a JSON object.
	n, err := gemini.CountTokensEstimate(body)
	if err != nil {
		h.refuse(w, r, f, errBadJSON)
		return nil
	}
	rt := h.table.routes[model]
	if rt == nil {
		h.refuse(w, r, f, errUnknownModel(model), clientModel(model))
		return nil
	}
	if key != nil && !key.allows(rt.name) {
		h.refuseKey(w, r, f, key, rt.name, errModelNotAllowed(rt.name))
		return nil
	}
	now := time.Now()
	for i := range rt.targets {
		u := rt.targets[i].up
		if !u.apis.has(apiGemini) || u.Cooling(now) > 0 {
			continue
		}
		// The body as sent (generation patches are no count parameters);
		// the model is in the upstream's URL.
		if h.relayCount(w, r, u, epGeminiCount, geminiCountBody(body, u.model)) {
			return nil
		}
		break // the first native one failed: estimate rather than wait on the next
	}
	w.Header().Set("X-LLM-Route-Estimate", "true")
	writeJSON(w, http.StatusOK, gemini.CountTokensBody(n))
	return nil
}

// geminiCountBody is a countTokens body for an upstream whose model is
// model: a nested generateContentRequest names its model too (Google
// requires it there), which is swapped; any other body passes as it is.
func geminiCountBody(body []byte, model string) []byte {
	if !bytes.Contains(body, []byte(`"generateContentRequest"`)) {
		return body
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return body
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(top["generateContentRequest"], &req) != nil || req == nil {
		return body
	}
	req["model"], _ = json.Marshal("models/" + strings.TrimPrefix(model, "models/"))
	var err error
	if top["generateContentRequest"], err = json.Marshal(req); err != nil {
		return body
	}
	out, err := json.Marshal(top)
	if err != nil {
		return body
	}
	return out
}

// serveGeminiModels answers GET …/v1beta/models (id "") with the list in
// Google's shape, and GET …/v1beta/models/{id} with one model or a 404.
// A client key with a models list was answered by keyListing.
func (h *Handler) serveGeminiModels(w http.ResponseWriter, r *http.Request, id string) error {
	if id == "" {
		writeJSON(w, http.StatusOK, h.table.geminiModels)
		return nil
	}
	if h.table.routes[id] == nil {
		h.refuse(w, r, frontGeminiModels, errUnknownModel(id), clientModel(id))
		return nil
	}
	writeJSON(w, http.StatusOK, gemini.ModelBody(id))
	return nil
}

// stripKeyQuery removes the `key` query parameter (Google's API key in
// the URL) from the request, and from its RequestURI, which other
// handlers' placeholders read; it returns the key's value.
func stripKeyQuery(r *http.Request) string {
	if !hasKeyQuery(r.URL.RawQuery) {
		return ""
	}
	q := r.URL.Query()
	key := q.Get("key")
	q.Del("key")
	r.URL.RawQuery = q.Encode()
	if i := strings.IndexByte(r.RequestURI, '?'); i >= 0 {
		r.RequestURI = r.RequestURI[:i]
		if r.URL.RawQuery != "" {
			r.RequestURI += "?" + r.URL.RawQuery
		}
	}
	return key
}
