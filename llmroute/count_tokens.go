package llmroute

import (
	"errors"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/anthropic"
)

// serveCountTokens answers POST …/messages/count_tokens. It takes
// no generation slot and never goes to an upstream without native Messages
// (a paid chat fallback would be sent the whole prompt for nothing): the
// first non-cooling native one answers, passed through; when there is none,
// or it fails, the proxy estimates, saying so in X-LLM-Route-Estimate.
func (h *Handler) serveCountTokens(w http.ResponseWriter, r *http.Request, key *clientKey) error {
	bodyBuf := getBuffer()
	defer putBuffer(bodyBuf)
	body, apiErr := readBody(r, h.maxBody, bodyBuf)
	if apiErr != nil {
		h.refuse(w, r, frontCountTokens, *apiErr)
		return nil
	}
	model, _, err := transform.ParseRequest(body)
	if err != nil {
		e := errBadJSON
		if errors.Is(err, transform.ErrNoModel) {
			e = errNoModel
		}
		h.refuse(w, r, frontCountTokens, e)
		return nil
	}
	rt := h.table.routes[model]
	if rt == nil && h.table.routers {
		rt, _ = h.table.suffixed(model) // a router model's union of models counts
	}
	if rt == nil {
		h.refuse(w, r, frontCountTokens, errUnknownModel(model), clientModel(model))
		return nil
	}
	if key != nil && !key.allows(rt.name) {
		h.refuseKey(w, r, frontCountTokens, key, rt.name, errModelNotAllowed(rt.name))
		return nil
	}
	now := time.Now()
	for i := range rt.targets {
		t := &rt.targets[i]
		if !t.up.apis.has(apiMessages) || t.up.Cooling(now) > 0 {
			continue
		}
		if h.countUpstream(w, r, t, body) {
			return nil
		}
		break // the first native one failed: estimate rather than wait on the next
	}
	w.Header().Set("X-LLM-Route-Estimate", "true")
	writeJSON(w, http.StatusOK, anthropic.CountTokensBody(anthropic.CountTokensEstimate(body)))
	return nil
}

// countUpstream asks t's upstream to count; it reports whether an answer
// (any status but a failover one) reached the client.
func (h *Handler) countUpstream(w http.ResponseWriter, r *http.Request, t *target, body []byte) bool {
	u := t.up
	src := body
	if !u.keepBill {
		src = anthropic.StripBillingBlock(make([]byte, 0, len(body)), body)
	}
	// Only the model is swapped: generation patches (max_tokens, sampling)
	// are not count_tokens parameters.
	out, err := transform.RewriteRequest(make([]byte, 0, len(src)+64), src, &transform.RequestEdit{Model: u.model})
	if err != nil {
		return false
	}
	return h.relayCount(w, r, u, epCountTokens, out)
}

// relayCount sends a token count request to u's endpoint ep; it reports
// whether an answer (any status but a failover one) reached the client.
func (h *Handler) relayCount(w http.ResponseWriter, r *http.Request, u *upstream, ep endpoint, out []byte) bool {
	// Through the attempt path (call.go), sent once: count_tokens holds no
	// slot, and a failure only means the proxy estimates instead.
	c := call{h: h, u: u, r: r, log: nopLogger}
	c.open(h.attemptContext(r.Context()))
	defer c.close()
	if res, ok := c.send(c.request(u.urls[ep], out)); !ok {
		// 404 included: a server that serves messages but not count_tokens.
		if ce := h.logger.Check(zapcore.InfoLevel, "count_tokens upstream failed, estimating"); ce != nil {
			if c.err != nil {
				ce.Write(zap.String("upstream", u.ID), zap.String("error", redactError(c.err)))
			} else {
				ce.Write(zap.String("upstream", u.ID), zap.Int("status", res.status))
			}
		}
		return false
	}
	resp := c.resp
	answer := getBuffer()
	defer putBuffer(answer)
	if _, err := answer.ReadFrom(io.LimitReader(resp.Body, 1<<20)); err != nil {
		return false
	}
	hdr := w.Header()
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		hdr.Set("Content-Type", ct)
	}
	writeJSON(w, resp.StatusCode, answer.Bytes())
	return true
}
