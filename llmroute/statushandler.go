package llmroute

import (
	"errors"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(StatusHandler{})
}

// StatusHandler is the `http.handlers.llm_route_status` module: the status
// page, status, explain and history of the admin API (the same code and
// answers) on an ordinary site, so a browser can open the page (Caddy's
// admin endpoint refuses a browser's navigation) and the site's own
// basic_auth, forward_auth or matchers protect it. It is read-only and
// shows every llm_route handler of the running config.
//
// It answers by the last element of the request path, so it works where
// it is mounted, with handle_path (which strips the prefix) or handle:
// `…/` the page, `…/status`, `…/explain`, `…/history` the JSON answers,
// `…/page.js` and `…/page.css` the page's assets; anything else is a 404.
// A request for the page without its trailing slash is redirected to it,
// so that the page's relative links resolve under the mount.
//
// It has no fields. It never calls the next handler.
type StatusHandler struct{}

// CaddyModule returns the Caddy module information.
func (StatusHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_route_status",
		New: func() caddy.Module { return new(StatusHandler) },
	}
}

// ServeHTTP dispatches to the admin API's handlers.
func (StatusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	var a adminAPI
	var err error
	p := r.URL.Path
	switch i := strings.LastIndexByte(p, '/'); p[i+1:] {
	case "status":
		err = a.handleStatus(w, r)
	case "explain":
		err = a.handleExplain(w, r)
	case "history":
		err = a.handleHistory(w, r)
	case "page.js", "page.css":
		err = servePage(w, r, p[i+1:])
	case "":
		orig := r.URL.Path
		if or, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
			orig = or.URL.Path
		}
		if !strings.HasSuffix(orig, "/") {
			// handle_path /llm-status* strips /llm-status to "".
			http.Redirect(w, r, orig+"/", http.StatusPermanentRedirect)
			return nil
		}
		err = servePage(w, r, "")
	default:
		err = caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found")}
	}
	var ae caddy.APIError
	if errors.As(err, &ae) {
		return caddyhttp.Error(ae.HTTPStatus, ae.Err)
	}
	return err
}

// Interface guard
var _ caddyhttp.MiddlewareHandler = StatusHandler{}
