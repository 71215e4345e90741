package llmroute

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/llm-route/caddy-llm-route/llmroute/placement"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Explain for a router model: which rule a request would match, with the
// effort and attributes given (effort=, attr=name=value) or read from a
// POSTed body, and the chain it would go to. Like the rest of explain it
// is a pure read: no counter moves and the judge is never asked.

// ruleExplanation is the `rule` member of a router model's explanation.
type ruleExplanation struct {
	// Name and Priority are the matching rule's.
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	// Effort is the request's effort and EffortSource where it came from:
	// "suffix" (the model name's), "explain" (effort=), "field" (the
	// POSTed body's own field) or "default" (medium).
	Effort       string `json:"effort"`
	EffortSource string `json:"effort_source"`
	// Judge is "not consulted" when the model has a judge and a request
	// without an effort would ask it: explain never does, and says medium.
	Judge string `json:"judge,omitempty"`
	// Attributes are the values of the attributes the rules read, as the
	// request would have them (a client key's id and labels included).
	Attributes map[string]string `json:"attributes"`
	// Unused are attributes given that no rule of the model reads.
	Unused []string `json:"unused_attributes,omitempty"`
	// Chain is the models in the order a request tries them, the first
	// one first (with a client key, only those it may use).
	Chain []string `json:"chain"`
	// Weighted is set for a rule with weights: how the first model was
	// chosen.
	Weighted *weightedVerdict `json:"weighted,omitempty"`
	Shadow   *Shadow          `json:"shadow,omitempty"`
	// NotAllowed is the 403 a request with the client key given would get.
	NotAllowed string `json:"not_allowed,omitempty"`
	// Candidates are the model's rules in the order they are tried, each
	// with whether it matches and, if not, why.
	Candidates []ruleCandidate `json:"candidates"`
}

// weightedVerdict says how a weighted rule chose the first model.
type weightedVerdict struct {
	// First is the model chosen first ("" when By is none: the choice is
	// random per request).
	First string `json:"first,omitempty"`
	// By is what was hashed: "user", "key", "affinity" (the session) or
	// "none"; Key is that value's 8-digit hash, never the value.
	By  string `json:"by"`
	Key string `json:"key,omitempty"`
}

type ruleCandidate struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	Matched  bool   `json:"matched"`
	Why      string `json:"why,omitempty"`
}

// ruleQuery is explain's effort= and attr= for a router model.
type ruleQuery struct {
	effort effort
	attrs  [][2]string // name (lower-case), value
	given  bool        // either was given
}

// parseRuleQuery reads effort= and attr= (repeatable; name=value or
// name:value, split at the first of the two).
func parseRuleQuery(q url.Values) (ruleQuery, *apiError) {
	var rq ruleQuery
	if s, ok := q["effort"]; ok && len(s) > 0 {
		rq.given = true
		if rq.effort = parseEffortValue([]byte(s[0])); rq.effort == effortNone {
			return rq, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_effort",
				message: "effort must be low, medium or high (or minimal, none, xhigh, max), got " + strconv.Quote(s[0])}
		}
	}
	for _, a := range q["attr"] {
		rq.given = true
		i := strings.IndexAny(a, "=:")
		if i <= 0 {
			return rq, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_attr",
				message: "attr wants name=value (or name:value), got " + strconv.Quote(a)}
		}
		rq.attrs = append(rq.attrs, [2]string{strings.ToLower(a[:i]), a[i+1:]})
	}
	return rq, nil
}

// findModel finds a model in the newest running config that has it: by
// name, else a router model with an effort suffix (`auto:high`).
func findModel(name string) (*Handler, *route, effort) {
	live := liveHandlers()
	for _, e := range live {
		if rt := e.h.table.routes[name]; rt != nil {
			return e.h, rt, effortNone
		}
	}
	for _, e := range live {
		if e.h.table.routers {
			if rt, pin := e.h.table.suffixed(name); rt != nil {
				return e.h, rt, pin
			}
		}
	}
	return nil, nil, effortNone
}

// keyByID is the client key with that id, nil if none.
func (h *Handler) keyByID(id string) *clientKey {
	for _, k := range h.keys {
		if k.id == id {
			return k
		}
	}
	return nil
}

// explainRule resolves a router model request the way resolveRule does,
// without counting it or asking the judge: the rule, its chain and the
// route explain walks (the chain's, narrowed to the client key's models).
// r is the POSTed request (nil for a GET); in carries the body, the
// session= key and the API's codec, and gets the body's spans.
func (h *Handler) explainRule(rs *ruleSet, pinned effort, rq ruleQuery, a api, r *http.Request,
	in *placeInput) (*ruleExplanation, *route, *apiError) {
	c := codecs[a]
	sh := c.rules()
	in.spans = c.prompt().spans()
	sh.addSpans(&in.spans)
	if in.body != nil {
		if _, _, _, err := transform.ParseRequestKeys(in.body, nil, &in.spans); err != nil {
			e := errBadJSON
			return nil, nil, &e
		}
		in.parsed = true
	}
	ex := &ruleExplanation{Attributes: map[string]string{}}
	e, src := pinned, "suffix"
	if e == effortNone {
		e, src = rq.effort, "explain"
	}
	if e == effortNone {
		e, src = sh.fieldEffort(in.body, &in.spans), "field"
	}
	if e == effortNone {
		e, src = effortMedium, "default"
		if rs.judge != "" {
			ex.Judge = "not consulted"
		}
	}
	ex.Effort, ex.EffortSource = e.String(), src

	// The client key first: its id and labels are the router's own.
	var key *clientKey
	for _, kv := range rq.attrs {
		if kv[0] == "key" {
			if key = h.keyByID(kv[1]); key == nil {
				return nil, nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_attr",
					message: "no client key has the id " + strconv.Quote(kv[1])}
			}
		}
	}
	hdr := r
	if hdr == nil {
		hdr = &http.Request{Header: http.Header{}}
	}
	var vals attrVals
	rs.readAttrs(&vals, hdr, sh, in.body, &in.spans, key)
	for _, kv := range rq.attrs {
		if kv[0] == "key" {
			continue
		}
		i := slices.IndexFunc(rs.attrs, func(s attrSpec) bool { return s.name == kv[0] })
		switch {
		case i < 0:
			if !slices.Contains(ex.Unused, kv[0]) {
				ex.Unused = append(ex.Unused, kv[0])
			}
		case rs.attrs[i].owned:
			return nil, nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_attr",
				message: "attribute " + strconv.Quote(kv[0]) + " is set by the router from the client key: give attr=key=<key id>"}
		default:
			vals[i] = attrVal{s: kv[1]}
		}
	}
	for i, s := range rs.attrs {
		if v := &vals[i]; v.set() {
			if v.b != nil {
				ex.Attributes[s.name] = string(v.b)
			} else {
				ex.Attributes[s.name] = v.s
			}
		}
	}

	var ru *rule
	for _, cand := range rs.byEffort[e] {
		if cand.matches(&vals) {
			ru = cand
			break
		}
	}
	ordered := slices.Clone(rs.rules)
	slices.SortStableFunc(ordered, func(x, y *rule) int { return y.priority - x.priority })
	for _, cand := range ordered {
		rc := ruleCandidate{Name: cand.name, Priority: cand.priority}
		switch {
		case cand.effort != effortNone && cand.effort != e:
			rc.Why = "effort " + cand.effort.String()
		default:
			rc.Why = cand.mismatch(rs, &vals)
			rc.Matched = rc.Why == ""
		}
		ex.Candidates = append(ex.Candidates, rc)
	}
	if ru == nil { // validation guarantees a catch-all for every effort
		e := errNoRule
		return nil, nil, &e
	}
	ex.Name, ex.Priority, ex.Shadow = ru.name, ru.priority, ru.shadow

	ch := ru.chains[0]
	if ru.weights != nil {
		k, by := h.stickyOf(rs, &vals, r, c, in.body, &in.spans, key, in.key)
		ex.Weighted = &weightedVerdict{By: by.String()}
		if by != byNone {
			if i := placement.Choose(k, ru.ids, ru.weights); i >= 0 {
				ch = ru.chains[i]
			}
			ex.Weighted.First, ex.Weighted.Key = ch.uses[0], shortHash(k)
		}
	}
	walk := ch.full
	ex.Chain = []string{}
	for _, m := range ch.uses {
		if key == nil || key.allows(m) {
			ex.Chain = append(ex.Chain, m)
		}
	}
	if key != nil {
		art := ch.api[a]
		switch n, narrowed := key.narrow[art]; {
		case !key.allows(rs.model):
			ex.NotAllowed = errModelNotAllowed(rs.model).message
		case art != nil && narrowed && n == nil:
			ex.NotAllowed = errNoModelOfRule(ru.name, rs.model).message
		case art != nil && narrowed:
			walk = n
		}
	}
	return ex, walk, nil
}

// mismatch says why the rule's attributes do not match ("" when they
// do): the first attribute that is absent or has another value.
func (ru *rule) mismatch(rs *ruleSet, vals *attrVals) string {
	for _, c := range ru.conds {
		name := rs.attrs[c.attr].name
		v := &vals[c.attr]
		if !v.set() {
			return name + " absent"
		}
		if !slices.ContainsFunc(c.values, v.is) {
			got := v.s
			if v.b != nil {
				got = string(v.b)
			}
			return name + " " + strconv.Quote(got) + " is not " + strings.Join(c.values, " or ")
		}
	}
	return ""
}
