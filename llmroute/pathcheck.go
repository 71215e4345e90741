package llmroute

import (
	"context"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The start-up path check: once a config has started, each provider's
// `GET <url>/models` is asked once in the background, with the provider's
// key, headers and transport. An answer of 404 or 405 means the url is not
// the API root the endpoint paths are appended to (most often it lacks
// /v1), which every request would otherwise discover by failing over: that
// is a WARN with a hint. A provider that does not answer at all is one INFO
// line: a local GPU server that is simply off is no mistake, and its
// upstreams fail over until it answers. Nothing waits for the check, and
// Cleanup cancels it.

// pathCheckTimeout bounds each provider's check.
const pathCheckTimeout = 5 * time.Second

// startPathChecks checks each provider's path in the background; Cleanup
// stops and waits for it.
func (h *Handler) startPathChecks() {
	if h.pathChecks != nil {
		return // the started hook of an already started config
	}
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	h.pathChecks, h.stopPathChecks = done, cancel
	// One upstream per provider carries what the provider's requests carry.
	seen := make(map[string]bool, len(h.Providers))
	var ups []*upstream
	for _, uc := range h.Upstreams {
		if u := h.table.upstreams[uc.ID]; !seen[u.Provider] {
			seen[u.Provider] = true
			ups = append(ups, u)
		}
	}
	var wg sync.WaitGroup
	for _, u := range ups {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					h.logger.Error("provider path check panicked", zap.Any("error", p), zap.ByteString("stack", debug.Stack()))
				}
			}()
			h.checkPath(ctx, u)
		})
	}
	go func() {
		wg.Wait()
		close(done)
	}()
}

// stopChecks cancels the path checks and waits for them to end.
func (h *Handler) stopChecks() {
	if h.pathChecks != nil {
		h.stopPathChecks()
		<-h.pathChecks
	}
}

// checkPath asks u's provider for its model list and logs what the answer
// says about the provider url.
func (h *Handler) checkPath(parent context.Context, u *upstream) {
	ctx, cancel := context.WithTimeout(parent, pathCheckTimeout)
	defer cancel()
	// A transport module may read placeholders from the request's replacer.
	ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer())
	target := u.base + "/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return // compileUpstream parsed the url's endpoints already
	}
	switch {
	case u.auth != "":
		req.Header[u.authHdr] = []string{u.auth}
	case u.keys != nil:
		req.Header[u.authHdr] = u.keys.keys[0].authValue
	}
	for a := range numAPIs {
		if u.apis.has(a) {
			for _, kv := range ownHeaders[a] {
				req.Header.Set(kv[0], kv[1]) // Anthropic's model list needs its version
			}
		}
	}
	for _, kv := range u.headers {
		req.Header.Set(kv[0], kv[1])
	}
	resp, err := u.transport.RoundTrip(req)
	if err != nil {
		if parent.Err() != nil {
			return // cancelled: the config is going away
		}
		if c := h.logger.Check(zapcore.InfoLevel, "provider not reachable at start-up"); c != nil {
			c.Write(zap.String("provider", u.Provider), zap.String("url", redactURL(target)),
				zap.String("error", redactError(err)),
				zap.String("note", "its upstreams fail over until it answers"))
		}
		return
	}
	drain(resp.Body)
	resp.Body.Close()
	if notFoundStatus(resp.StatusCode) {
		if c := h.logger.Check(zapcore.WarnLevel, "provider url may be wrong"); c != nil {
			c.Write(zap.String("provider", u.Provider), zap.String("url", redactURL(target)),
				zap.Int("status", resp.StatusCode), zap.String("hint", pathHint(u.base)))
		}
		return
	}
	if c := h.logger.Check(zapcore.DebugLevel, "provider path checked"); c != nil {
		c.Write(zap.String("provider", u.Provider), zap.String("url", redactURL(target)), zap.Int("status", resp.StatusCode))
	}
}
