package llmroute

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"html/template"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI is the `admin.api.llm_route` module: the router's live state on
// Caddy's admin endpoint, behind the admin listener's host and origin checks
// and any access control configured for it. It serves
//
//   - GET /llm_route/status — JSON snapshot of every upstream, provider and
//     model of every running llm_route handler;
//   - GET /llm_route/explain?model=M[&tokens=N][&api=A][&session=S] — where a
//     request for M would go now and why, per upstream (pool members with
//     their placement rank and reason, for the affinity key S); POST with a
//     request body of the API explains that request (its model, prompt and
//     affinity key); for a router model, also [&effort=E][&attr=NAME=VALUE]…
//     and the rule that matches, its chain and how its first model is chosen;
//   - POST /llm_route/plan with a candidate config (JSON, or another
//     format by its Content-Type as /load takes it) — what loading it would
//     change and carry over, checked as /load checks it, applied nowhere
//     (plan.go);
//   - GET /llm_route/history — the last 15 minutes per upstream, model,
//     client key and pool, in 10-second buckets (history.go);
//   - GET /llm_route/ — an HTML status page, rendered with the snapshot and
//     refreshed by its script every second, with charts of the history.
//
// The http.handlers.llm_route_status handler serves the same answers on
// an ordinary site (statushandler.go).
//
// It has no configuration: Caddy loads every admin.api module by itself.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.llm_route",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes under /llm_route/.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/llm_route/status", Handler: caddy.AdminHandlerFunc(a.handleStatus)},
		{Pattern: "/llm_route/explain", Handler: caddy.AdminHandlerFunc(a.handleExplain)},
		{Pattern: "/llm_route/plan", Handler: caddy.AdminHandlerFunc(a.handlePlan)},
		{Pattern: "/llm_route/history", Handler: caddy.AdminHandlerFunc(a.handleHistory)},
		{Pattern: "/llm_route/", Handler: caddy.AdminHandlerFunc(a.handlePage)},
	}
}

var (
	//go:embed admin_page.html
	pageHTML string
	//go:embed admin_page.js
	pageJS []byte
	//go:embed admin_page.css
	pageCSS []byte

	pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
		"slots":    slotsText,
		"cooling":  coolingText,
		"limitMax": limitMax,
		"since":    sinceText,
		"failure":  failureText,
		"probe":    probeText,
		"oldest":   oldestText,
		// pools
		"memberSlots": memberSlotsText,
		"placements":  placementsText,
		"cachedRatio": cachedRatioText,
		// router models
		"hasRules":    hasRules,
		"ruleEffort":  ruleEffortText,
		"ruleMatch":   ruleMatchText,
		"ruleWeights": ruleWeightsText,
		"ruleShadow":  ruleShadowText,
	}).Parse(pageHTML))
)

// pageCSP allows nothing but the page's own assets: no inline script or
// style, no other origin.
const pageCSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

func (adminAPI) handleStatus(w http.ResponseWriter, r *http.Request) error {
	if err := onlyGet(r); err != nil {
		return err
	}
	return writeAdminJSON(w, snapshot(time.Now()))
}

func (adminAPI) handleHistory(w http.ResponseWriter, r *http.Request) error {
	if err := onlyGet(r); err != nil {
		return err
	}
	return writeAdminJSON(w, historyOf(time.Now()))
}

// maxExplainBody bounds a POSTed explain body: a long agent conversation.
const maxExplainBody = 32 << 20

func (adminAPI) handleExplain(w http.ResponseWriter, r *http.Request) error {
	var body []byte
	if r.Method == http.MethodPost {
		var err error
		if body, err = io.ReadAll(io.LimitReader(r.Body, maxExplainBody+1)); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		if len(body) > maxExplainBody {
			errTooLarge(maxExplainBody).write(w)
			return nil
		}
	} else if err := onlyGet(r); err != nil {
		return err
	}
	q := r.URL.Query()
	name := q.Get("model")
	if body != nil {
		model, _, err := transform.ParseRequest(body)
		switch {
		case err != nil && !errors.Is(err, transform.ErrNoModel):
			errBadJSON.write(w)
			return nil
		case name == "":
			name = model
		}
	}
	if name == "" {
		apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "missing_model",
			message: "explain needs ?model=NAME"}.write(w)
		return nil
	}
	var tokens *int64
	if s := q.Get("tokens"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_tokens",
				message: "tokens must be a non-negative integer"}.write(w)
			return nil
		}
		tokens = &n
	}
	a := apiChat
	if s := q.Get("api"); s != "" {
		set, err := parseAPIs([]string{s})
		if err != nil {
			apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_api",
				message: "api " + err.Error()}.write(w)
			return nil
		}
		for a = range numAPIs {
			if set.has(a) {
				break
			}
		}
	}
	rq, apiErr := parseRuleQuery(q)
	if apiErr != nil {
		apiErr.write(w)
		return nil
	}
	h, rt, pinned := findModel(name)
	if rt == nil {
		errUnknownModel(name).write(w)
		return nil
	}
	in := &placeInput{body: body, codec: codecs[a], led: rt.ledger(), key: q.Get("session"), now: time.Now(), explain: true}
	if body != nil {
		in.r = r // the session headers sent with it
	}
	if rt.rules == nil {
		if rq.given {
			apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "not_a_router_model",
				message: "model " + strconv.Quote(rt.name) + " has no rules: effort and attr apply to router models"}.write(w)
			return nil
		}
		return writeAdminJSON(w, explain(rt, a, tokens, in))
	}
	rv, walk, apiErr := h.explainRule(rt.rules, pinned, rq, a, in.r, in)
	if apiErr != nil {
		apiErr.write(w)
		return nil
	}
	in.led = walk.ledger()
	ex := explain(walk, a, tokens, in)
	ex.Rule = rv
	if rv.NotAllowed != "" {
		ex.Choice, ex.Outcome = nil, outcomeNotAllowed
	}
	return writeAdminJSON(w, ex)
}

// handlePage serves the status page and its two assets; anything else under
// /llm_route/ is a 404.
func (adminAPI) handlePage(w http.ResponseWriter, r *http.Request) error {
	name, ok := strings.CutPrefix(r.URL.Path, "/llm_route/")
	if !ok {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found")}
	}
	return servePage(w, r, name)
}

// servePage serves the page ("") or one of its assets ("page.js",
// "page.css"). The page names its assets and the JSON answers by relative
// URLs, so it works wherever it is mounted.
func servePage(w http.ResponseWriter, r *http.Request, name string) error {
	if err := onlyGet(r); err != nil {
		return err
	}
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	switch name {
	case "":
		var buf bytes.Buffer
		if err := pageTemplate.Execute(&buf, snapshot(time.Now())); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
		}
		hdr.Set("Content-Security-Policy", pageCSP)
		hdr.Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(buf.Bytes())
	case "page.js":
		hdr.Set("Content-Type", "text/javascript; charset=utf-8")
		_, _ = w.Write(pageJS)
	case "page.css":
		hdr.Set("Content-Type", "text/css; charset=utf-8")
		_, _ = w.Write(pageCSS)
	default:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found")}
	}
	return nil
}

func onlyGet(r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed")}
	}
	return nil
}

func writeAdminJSON(w http.ResponseWriter, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}

// Template helpers; page.js renders the same texts on refresh.

// slotsText is "in use/limit", "∞" for unlimited.
func slotsText(us upstreamStatus) string { return slotPair(us.Inflight, us.Limit) }

// slotPair is "in use/limit", "∞" for a nil (unlimited) limit.
func slotPair(inflight int64, limit *int64) string {
	l := "∞"
	if limit != nil {
		l = strconv.FormatInt(*limit, 10)
	}
	return strconv.FormatInt(inflight, 10) + "/" + l
}

// limitMax is the meter's maximum: the limit, or the in-flight count when
// unlimited (a full bar reads "all that are running").
func limitMax(us upstreamStatus) int64 {
	if us.Limit != nil {
		return *us.Limit
	}
	return max(us.Inflight, 1)
}

// coolingText is "12s (failure)", or "—" when available.
func coolingText(us upstreamStatus) string {
	if us.CoolingReason == nil {
		return "—"
	}
	return strconv.Itoa(int(math.Ceil(us.CoolingSeconds))) + "s (" + *us.CoolingReason + ")"
}

// sinceText renders a time as UTC RFC 3339, "—" when unknown.
func sinceText(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return t.UTC().Format(time.RFC3339)
}

// failureText is "5xx 2026-12-01T10:00:00Z": the last failed attempt's
// class and when the cooling began (or the attempt ended); "—" for none.
func failureText(us upstreamStatus) string {
	if us.LastFailureAt == nil {
		return "—"
	}
	if us.LastFailure == nil {
		return sinceText(us.LastFailureAt)
	}
	return *us.LastFailure + " " + sinceText(us.LastFailureAt)
}

// probeText is the probe counters and the last probe: "2 / 1, last ok
// 2026-12-01T10:00:00Z".
func probeText(us upstreamStatus) string {
	s := strconv.FormatInt(us.Probes.OK, 10) + " / " + strconv.FormatInt(us.Probes.Fail, 10)
	if us.LastProbe != nil {
		s += ", last " + us.LastProbe.Result + " " + sinceText(&us.LastProbe.At)
	}
	return s
}

// oldestText is ", oldest 12s" while requests wait, else "".
func oldestText(ms modelStatus) string {
	if ms.OldestWaitSeconds <= 0 {
		return ""
	}
	return ", oldest " + strconv.Itoa(int(math.Ceil(ms.OldestWaitSeconds))) + "s"
}

// Interface guards
var _ caddy.AdminRouter = adminAPI{}

// memberSlotsText is a pool member's "in use/limit".
func memberSlotsText(m memberStatus) string { return slotPair(m.Inflight, m.Limit) }

// placementsText lists a member's placements by reason in a fixed order:
// "pinned 12, warm 3, least_busy 5"; "none" before the first.
func placementsText(m memberStatus) string {
	var b strings.Builder
	for _, r := range reasonNames[1:] {
		if n := m.Placements[r]; n > 0 {
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			b.WriteString(r + " " + strconv.FormatInt(n, 10))
		}
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// cachedRatioText is the member's realised cached ratio as a percentage,
// "—" when no answer reported one.
func cachedRatioText(m memberStatus) string {
	if m.CachedRatio == nil {
		return "—"
	}
	return strconv.Itoa(int(math.Round(*m.CachedRatio*100))) + " %"
}

// hasRules reports whether any model is a router model.
func hasRules(ms []modelStatus) bool {
	return slices.ContainsFunc(ms, func(m modelStatus) bool { return len(m.Rules) > 0 })
}

// ruleEffortText is the rule's effort, "any" when it takes every one.
func ruleEffortText(r ruleStatus) string {
	if r.Effort == "" {
		return "any"
	}
	return r.Effort
}

// ruleMatchText is "language=es, team=billing|payments" by attribute
// name, "—" for a catch-all.
func ruleMatchText(r ruleStatus) string {
	if len(r.Match) == 0 {
		return "—"
	}
	names := make([]string, 0, len(r.Match))
	for n := range r.Match {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, n := range names {
		names[i] = n + "=" + strings.Join(r.Match[n], "|")
	}
	return strings.Join(names, ", ")
}

// ruleWeightsText is "90/10", "—" without weights.
func ruleWeightsText(r ruleStatus) string {
	if len(r.Weights) == 0 {
		return "—"
	}
	parts := make([]string, len(r.Weights))
	for i, w := range r.Weights {
		parts[i] = strconv.Itoa(w)
	}
	return strings.Join(parts, "/")
}

// ruleShadowText is "qwen-candidate 25 %", "—" without a shadow.
func ruleShadowText(r ruleStatus) string {
	if r.Shadow == nil {
		return "—"
	}
	return r.Shadow.Model + " " + strconv.FormatFloat(math.Round(r.Shadow.Fraction*1000)/10, 'f', -1, 64) + " %"
}
