package llmroute

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TEMPORARY: replaced by the real lifecycle shortly.
func (h *Handler) Provision(ctx caddy.Context) error { return nil }
func (h *Handler) Validate() error                   { return validateConfig(h.Providers, h.Upstreams, h.Models) }
func (h *Handler) Cleanup() error                    { return nil }
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return next.ServeHTTP(w, r)
}
