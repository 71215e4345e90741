package llmroute

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
	"github.com/llm-route/caddy-llm-route/llmroute/placement"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Router models: a model with rules instead of upstreams. Each request
// finds its effort (the name's suffix, a body field, the judge, else
// medium) and its attributes (body metadata and user, X-LLM-Attr-*
// headers, the router-set key and key labels), and goes to the chain of
// the matching rule with the highest priority. A chain is an ordinary
// route, compiled at provision from the used models' own targets, so
// failover, slots, queues, pools, budgets and resume work on it unchanged.
// The parse pass that reads the model also notes the members the rules
// read; plain models pay one branch and nothing else.

// effort is a request's effort; effortNone is "not given" (and, in a
// rule, "any").
type effort uint8

const (
	effortNone effort = iota
	effortLow
	effortMedium
	effortHigh
	numEfforts
)

var effortNames = [numEfforts]string{"", "low", "medium", "high"}

func (e effort) String() string { return effortNames[e] }

// effortSource is where a request's effort came from.
type effortSource uint8

const (
	srcSuffix effortSource = iota
	srcField
	srcJudge
	srcDefault
	numSources
)

var sourceNames = [numSources]string{"suffix", "field", "judge", "default"}

func (s effortSource) String() string { return sourceNames[s] }

// effortHeaders are the X-LLM-Route-Effort values, "high (suffix)", built
// once so that a request formats nothing.
var effortHeaders = func() (h [numEfforts][numSources]string) {
	for e := effortLow; e < numEfforts; e++ {
		for s := range numSources {
			h[e][s] = e.String() + " (" + s.String() + ")"
		}
	}
	return h
}()

// parseEffortExact reads a configured effort: low, medium or high.
func parseEffortExact(s string) effort {
	switch s {
	case "low":
		return effortLow
	case "medium":
		return effortMedium
	case "high":
		return effortHigh
	}
	return effortNone
}

// parseEffortValue reads a client's effort value, ASCII case-insensitive:
// minimal and none count as low, xhigh and max as high. Anything else is
// no effort, and the next source applies (the upstream may know values
// the router does not).
func parseEffortValue(v []byte) effort {
	var buf [8]byte
	if len(v) > len(buf) {
		return effortNone
	}
	for i, c := range v {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	switch string(buf[:len(v)]) {
	case "low", "minimal", "none":
		return effortLow
	case "medium":
		return effortMedium
	case "high", "xhigh", "max":
		return effortHigh
	}
	return effortNone
}

// Messages' thinking.budget_tokens thresholds: below the first is low,
// below the second medium, else high.
const (
	budgetMedium = 4096
	budgetHigh   = 16384
)

// The slots of transform.Spans the rules use; 0–3 are placement's.
const (
	spanEffort   = 4 // the effort's top-level member
	spanBudget   = 5 // Messages' thinking
	spanUser     = 6 // top-level user
	spanMetadata = 7 // metadata
)

// ruleShape says where a request of one API keeps its effort and user.
type ruleShape struct {
	// effort is the effort's top-level member and, when that is an
	// object, the member of it that holds the effort.
	effort [2]string
	// budget is Messages' thinking object and its budget_tokens.
	budget [2]string
	// user is the top-level user member; userIn, the member of metadata
	// that is the user (Messages' user_id).
	user, userIn string
	// said is where the judge reads the user's last words (judge.go): a
	// top-level member holding a string or an array of messages, the
	// member of a message that holds its content (a string or a list of
	// parts), and the type of its text parts ("": any part with a text).
	said [3]string
}

// addSpans names the members the rules read in the request's parse.
func (sh *ruleShape) addSpans(sp *transform.Spans) {
	sp.Names[spanEffort] = sh.effort[0]
	sp.Names[spanBudget] = sh.budget[0]
	sp.Names[spanUser] = sh.user
	sp.Names[spanMetadata] = "metadata"
}

// ruleSet is one router model's rules, compiled.
type ruleSet struct {
	model string
	// attrs are the attributes any rule matches on, plus user when a rule
	// is weighted (at most maxMatchAttrs).
	attrs    []attrSpec
	userAttr int // index of user in attrs, -1 when no rule reads it
	// byEffort[e] are the rules a request of effort e may match, by
	// priority (highest first, ties in list order); each ends with a
	// catch-all (validated).
	byEffort [numEfforts][]*rule
	rules    []*rule // list order
	// judge is the judge's model, "" for none; judging asks it
	// (judge.go).
	judge   string
	judging *judge
}

// attrSpec is one attribute the rules read.
type attrSpec struct {
	name   string // lower-case
	header string // "X-Llm-Attr-<Name>", canonical, read with r.Header[header]
	// owned: set by the router only (key, or a label name of any client
	// key), never from the body or a header.
	owned bool
}

// cond is one match entry: attribute attr equals one of values.
type cond struct {
	attr   int
	values []string
}

// rule is one rule, compiled.
type rule struct {
	name     string
	priority int
	effort   effort // effortNone: any
	conds    []cond
	use      []string
	ids      []uint64 // placement.HashString of each model of use
	weights  []uint32 // nil: not weighted
	// chains are the rule's routes: one per possible first model when
	// weighted (chains[i] starts with use[i]), else one in use's order.
	chains []*chain
	// counters are llm_proxy_rule_requests_total by effort (nil for an
	// effort the rule never takes).
	counters [numEfforts]prometheus.Counter
	shadow   *Shadow // as configured
	// shadowSend is the shadow, compiled (shadow.go); nil when the rule
	// has none or its fraction is 0.
	shadowSend *shadowSpec
}

// chain is a rule's chain of models, compiled as routes.
type chain struct {
	full *route          // every target of the chain (placement ranks over it)
	api  [numAPIs]*route // restricted to the upstreams that serve each API; nil: none
	uses []string        // the models, in the chain's order
}

// attrVal is one attribute's value for a request: bytes of the body (a
// decoded copy when the JSON string has escapes), or a string from a
// header or the router. Empty counts as absent.
type attrVal struct {
	b []byte
	s string
}

func (v *attrVal) set() bool { return len(v.b) > 0 || v.s != "" }

func (v *attrVal) is(want string) bool {
	if v.b != nil {
		return string(v.b) == want
	}
	return v.s == want
}

// attrVals are a request's attribute values, on its stack.
type attrVals [maxMatchAttrs]attrVal

// matches reports whether every condition of the rule holds.
func (ru *rule) matches(vals *attrVals) bool {
	for _, c := range ru.conds {
		v := &vals[c.attr]
		if !v.set() {
			return false
		}
		ok := false
		for _, want := range c.values {
			if v.is(want) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// suffixed resolves `<router>:<effort>`: the router model's route and the
// pinned effort, or nil when name is no such thing. Called only after the
// exact lookup missed, so a plain model named `qwen3:8b` is unaffected.
func (t *routeTable) suffixed(name string) (*route, effort) {
	i := strings.LastIndexByte(name, ':')
	if i < 0 {
		return nil, effortNone
	}
	rt := t.routes[name[:i]]
	if rt == nil || rt.rules == nil {
		return nil, effortNone
	}
	e := parseEffortExact(name[i+1:])
	if e == effortNone {
		return nil, effortNone
	}
	return rt, e
}

// compileRules builds the rule sets of the router models: their chains
// from the plain models' compiled routes (so it runs after those and
// after their duplicate-key bits), and each router's own route, the
// union of its chains, for status and the model list.
func (h *Handler) compileRules() error {
	if !h.table.routers {
		return nil
	}
	owned := map[string]bool{"key": true}
	for _, k := range h.Keys {
		for name := range k.Labels {
			owned[name] = true
		}
	}
	for _, m := range h.Models {
		if len(m.Rules) == 0 {
			continue
		}
		rt := h.table.routes[m.Name]
		rs := &ruleSet{model: m.Name, userAttr: -1}
		attrIndex := map[string]int{}
		addAttr := func(name string) int {
			if i, ok := attrIndex[name]; ok {
				return i
			}
			attrIndex[name] = len(rs.attrs)
			rs.attrs = append(rs.attrs, attrSpec{name: name, owned: owned[name],
				header: http.CanonicalHeaderKey("X-Llm-Attr-" + name)})
			return len(rs.attrs) - 1
		}
		var unionUse []string
		for _, rc := range m.Rules {
			ru := &rule{name: rc.Name, priority: rc.Priority, effort: parseEffortExact(rc.Effort), use: rc.Use, shadow: rc.Shadow,
				shadowSend: h.compileShadow(rc.Shadow)}
			names := make([]string, 0, len(rc.Match))
			for a := range rc.Match {
				names = append(names, a)
			}
			sort.Strings(names)
			for _, a := range names {
				ru.conds = append(ru.conds, cond{attr: addAttr(a), values: rc.Match[a]})
			}
			for _, u := range rc.Use {
				ru.ids = append(ru.ids, placement.HashString(u))
				if !slices.Contains(unionUse, u) {
					unionUse = append(unionUse, u)
				}
			}
			if len(rc.Weights) > 0 {
				addAttr("user") // the sticky key
				for _, w := range rc.Weights {
					ru.weights = append(ru.weights, uint32(w))
				}
				for i := range rc.Use {
					order := append([]string{rc.Use[i]}, slices.Delete(slices.Clone(rc.Use), i, i+1)...)
					ru.chains = append(ru.chains, h.compileChain(rt, order))
				}
			} else {
				ru.chains = []*chain{h.compileChain(rt, rc.Use)}
			}
			for e := effortLow; e < numEfforts; e++ {
				if ru.effort == effortNone || ru.effort == e {
					ru.counters[e] = h.metrics.rules.WithLabelValues(m.Name, ru.name, e.String())
				}
			}
			rs.rules = append(rs.rules, ru)
		}
		if i, ok := attrIndex["user"]; ok {
			rs.userAttr = i
		}
		if len(rs.attrs) > maxMatchAttrs {
			return fmt.Errorf("llm_route config: model %q: more than %d distinct match attributes", m.Name, maxMatchAttrs)
		}
		for e := effortLow; e < numEfforts; e++ {
			for _, ru := range rs.rules {
				if ru.effort == effortNone || ru.effort == e {
					rs.byEffort[e] = append(rs.byEffort[e], ru)
				}
			}
			slices.SortStableFunc(rs.byEffort[e], func(a, b *rule) int { return b.priority - a.priority })
		}
		if j := m.Judge; j != nil {
			if h.table.apiRoutes[apiChat][j.Model] == nil {
				return fmt.Errorf("llm_route config: model %q: judge: model %q has no upstream that serves chat", m.Name, j.Model)
			}
			rs.judge = j.Model
			rs.judging = h.newJudge(m.Name, j, h.table.apiRoutes[apiChat][j.Model])
		}
		// The router's own route: every model it may use, for status,
		// count_tokens and the key listing.
		u := h.compileChain(rt, unionUse)
		rt.targets, rt.dupKeys, rt.rules = u.full.targets, u.full.dupKeys, rs
		rt.prepareFit(h.LongContextThreshold)
		for a := range numAPIs {
			if u.api[a] != nil {
				if h.table.apiRoutes[a] == nil {
					h.table.apiRoutes[a] = make(map[string]*route)
				}
				h.table.apiRoutes[a][rt.name] = u.api[a]
			}
		}
	}
	return nil
}

// compileChain builds the route of a chain of plain models, in order:
// each model's targets (edit, counters, series, pool) copied as they are,
// renumbered in the chain; an upstream the chain already reached is tried
// once, at its first place. The chain has the router's name, queue,
// resume and repeat guard settings: a router's chains share its one queue.
func (h *Handler) compileChain(router *route, uses []string) *chain {
	full := &route{name: router.name, nameAny: router.nameAny, queueSize: router.queueSize,
		queueTimeout: router.queueTimeout, resume: router.resume, guard: router.guard}
	stepOff := 0
	for _, name := range uses {
		src := h.table.routes[name]
		steps := 0
		for _, t := range src.targets {
			steps = max(steps, t.step+1)
			if slices.ContainsFunc(full.targets, func(o target) bool { return o.up == t.up }) {
				continue
			}
			t.step += stepOff
			t.base = len(full.targets)
			t.long = nil
			full.targets = append(full.targets, t)
		}
		stepOff += steps
		full.dupKeys |= src.dupKeys
	}
	full.prepareFit(h.LongContextThreshold)
	ch := &chain{full: full, uses: uses}
	for a := range numAPIs {
		if sub := full.servingAPI(a); sub != nil {
			if sub != full {
				sub.prepareFit(h.LongContextThreshold)
			}
			ch.api[a] = sub
		}
	}
	return ch
}

// resolveRule finds a router model request's effort, attributes, rule and
// chain, sets the route headers and counts the rule. It returns the chain
// and its route for the request's API, or nils when it refused the
// request (the answer is written).
func (h *Handler) resolveRule(w http.ResponseWriter, r *http.Request, fr *frontReq, rs *ruleSet, pinned effort,
	body []byte, sp *transform.Spans, key *clientKey) (*chain, *route) {
	sh := fr.codec.rules()
	e, src := pinned, srcSuffix
	if e == effortNone {
		e, src = sh.fieldEffort(body, sp), srcField
	}
	// A key that may not use the router model is refused later: its
	// request is not worth a question the operator pays for.
	if e == effortNone && rs.judging != nil && (key == nil || key.allows(rs.model)) {
		if e = h.askJudge(r, rs, fr, body); e != effortNone {
			src = srcJudge
		}
	}
	if e == effortNone {
		e, src = effortMedium, srcDefault
	}

	var vals attrVals
	rs.readAttrs(&vals, r, sh, body, sp, key)

	var ru *rule
	for _, c := range rs.byEffort[e] {
		if c.matches(&vals) {
			ru = c
			break
		}
	}
	if ru == nil {
		// Validation guarantees a catch-all for every effort.
		h.refuse(w, r, fr.f, errNoRule, zap.String("model", rs.model))
		return nil, nil
	}
	ch := ru.chains[0]
	if ru.weights != nil {
		if i := placement.Choose(h.stickyKey(rs, &vals, r, fr, body, sp, key), ru.ids, ru.weights); i >= 0 {
			ch = ru.chains[i]
		}
	}
	ru.counters[e].Inc()
	fr.rule, fr.effort, fr.effortSrc = ru, e, src
	if h.routeHeaders {
		// One allocation for both values, each slice capped at its
		// element (Caddy may rewrite header values in place).
		v := new([2]string)
		v[0], v[1] = ru.name, effortHeaders[e][src]
		hdr := w.Header()
		hdr[hdrRouteRule] = v[0:1:1]
		hdr[hdrRouteEffort] = v[1:2:2]
	}
	rt := ch.api[fr.api]
	if rt == nil {
		h.refuse(w, r, fr.f, errNoAPI(rs.model, fr.api), zap.String("model", rs.model), zap.String("rule", ru.name))
		return nil, nil
	}
	if key != nil && key.narrow != nil && key.allows(rs.model) {
		// The chain, filtered to the models the key may use.
		if n, ok := key.narrow[rt]; ok {
			if n == nil {
				h.refuseKey(w, r, fr.f, key, rs.model, errNoModelOfRule(ru.name, rs.model))
				return nil, nil
			}
			rt = n
		}
	}
	return ch, rt
}

// errNoModelOfRule is the 403 for a key that may use the router model but
// none of the models of the chain its request's rule picked.
func errNoModelOfRule(rule, model string) apiError {
	e := errModelNotAllowed(model)
	e.message = "this API key may use no model of rule " + strconv.Quote(rule) + " of model " + strconv.Quote(model)
	return e
}

// narrowChains maps each chain route of the router models that reaches a
// model the key may not use to the route without those models (nil when
// none is left): a key's models list filters the chains too.
func (h *Handler) narrowChains(k *clientKey) {
	if !h.table.routers || k.all {
		return
	}
	for _, rt := range h.table.routes {
		if rt.rules == nil {
			continue
		}
		for _, ru := range rt.rules.rules {
			for _, ch := range ru.chains {
				for _, art := range ch.api {
					if art == nil {
						continue
					}
					if _, done := k.narrow[art]; done {
						continue
					}
					sub := *art
					sub.targets = nil
					for _, t := range art.targets {
						if k.allows(t.model) {
							sub.targets = append(sub.targets, t)
						}
					}
					switch len(sub.targets) {
					case len(art.targets):
						continue
					case 0:
						if k.narrow == nil {
							k.narrow = make(map[*route]*route)
						}
						k.narrow[art] = nil
						continue
					}
					sub.prepareFit(h.LongContextThreshold)
					if k.narrow == nil {
						k.narrow = make(map[*route]*route)
					}
					k.narrow[art] = &sub
				}
			}
		}
	}
}

// spanValue is the value a span notes, nil when absent.
func spanValue(body []byte, sp *transform.Spans, i int) []byte {
	if sp.At[i][1] == 0 {
		return nil
	}
	return body[sp.At[i][0]:sp.At[i][1]]
}

// member is the raw value of key in the JSON object v, nil when v is no
// object or has no such member.
func member(v []byte, key string) []byte {
	if len(v) == 0 || v[0] != '{' {
		return nil
	}
	return jsonscan.ObjGet(v, key)
}

// fieldEffort is the effort the body's own field asks for, effortNone when
// it has none (or one the router does not know).
func (sh *ruleShape) fieldEffort(body []byte, sp *transform.Spans) effort {
	if sh.effort[0] != "" {
		v := spanValue(body, sp, spanEffort)
		if sh.effort[1] != "" {
			v = member(v, sh.effort[1])
		}
		if jsonscan.IsString(v) {
			if e := parseEffortValue(v[1 : len(v)-1]); e != effortNone {
				return e
			}
		}
	}
	if sh.budget[0] != "" {
		t := spanValue(body, sp, spanBudget)
		if typ := member(t, "type"); jsonscan.StrIs(typ, false, "disabled") {
			return effortNone
		}
		if n := jsonscan.NumberOrNil(member(t, sh.budget[1])); n != nil {
			switch b := jsonscan.ParseUint(n); {
			case b < budgetMedium:
				return effortLow
			case b < budgetHigh:
				return effortMedium
			default:
				return effortHigh
			}
		}
	}
	return effortNone
}

// readAttrs fills vals, each source overriding the one before: the body's
// metadata (string members), user, X-LLM-Attr-* headers, then the
// router's own key and the key's labels. An owned attribute takes the
// router's value only. Values point into the body; only a value with JSON
// escapes is copied (decoded).
func (rs *ruleSet) readAttrs(vals *attrVals, r *http.Request, sh *ruleShape, body []byte,
	sp *transform.Spans, key *clientKey) {
	str := func(v []byte) []byte {
		if !jsonscan.IsString(v) {
			return nil
		}
		raw := v[1 : len(v)-1]
		if bytes.IndexByte(raw, '\\') >= 0 {
			return jsonscan.AppendUnescape(nil, raw)
		}
		return raw
	}
	var userIn []byte
	if md := spanValue(body, sp, spanMetadata); len(md) > 0 && md[0] == '{' {
		it := jsonscan.IterObject(md, 0, false)
		var m jsonscan.Member
		for it.Next(&m) {
			if sh.userIn != "" && jsonscan.KeyIs(md, &m, sh.userIn) {
				userIn = md[m.Vs:m.Ve]
			}
			for i := range rs.attrs {
				if a := &rs.attrs[i]; !a.owned && jsonscan.KeyIs(md, &m, a.name) {
					if s := str(md[m.Vs:m.Ve]); s != nil {
						vals[i] = attrVal{b: s}
					}
					break
				}
			}
		}
	}
	if u := rs.userAttr; u >= 0 && !rs.attrs[u].owned {
		v := userIn
		if sh.user != "" {
			v = spanValue(body, sp, spanUser)
		}
		if s := str(v); len(s) > 0 {
			vals[u] = attrVal{b: s}
		}
	}
	for i := range rs.attrs {
		a := &rs.attrs[i]
		if a.owned {
			vals[i] = attrVal{}
			if key != nil {
				if a.name == "key" {
					vals[i].s = key.id
				} else {
					vals[i].s = key.labels[a.name]
				}
			}
			continue
		}
		if hv := r.Header[a.header]; len(hv) > 0 && hv[0] != "" {
			vals[i] = attrVal{s: hv[0]}
		}
	}
}

// stickyKey is what a weighted rule's choice hashes, the first present:
// the user attribute, the client key, the request's own affinity key
// (its session headers, the body's cache key, else its conversation's
// session id); without any, a random key (the weights still hold, per
// request).
func (h *Handler) stickyKey(rs *ruleSet, vals *attrVals, r *http.Request, fr *frontReq, body []byte, sp *transform.Spans, key *clientKey) uint64 {
	k, _ := h.stickyOf(rs, vals, r, fr.codec, body, sp, key, "")
	return k
}

// stickyBy is what a weighted choice hashed; explain shows it.
type stickyBy uint8

const (
	byUser stickyBy = iota
	byKey
	byAffinity
	byNone // nothing to stick to: random per request
)

var stickyNames = [...]string{"user", "key", "affinity", "none"}

func (b stickyBy) String() string { return stickyNames[b] }

// stickyOf is stickyKey and what it hashed. given is an affinity key given
// outright (explain's session=); r may be nil (explain without a request).
func (h *Handler) stickyOf(rs *ruleSet, vals *attrVals, r *http.Request, c codec, body []byte, sp *transform.Spans,
	key *clientKey, given string) (uint64, stickyBy) {
	if u := rs.userAttr; u >= 0 && vals[u].set() {
		if vals[u].b != nil {
			return placement.HashBytes(vals[u].b), byUser
		}
		return placement.HashString(vals[u].s), byUser
	}
	if key != nil {
		return key.idHash, byKey
	}
	if given != "" {
		return placement.HashString(given), byAffinity
	}
	if r != nil {
		if s := clientSession(r); s != "" {
			return placement.HashString(s), byAffinity
		}
		if s := r.Header.Get("X-Session-Id"); s != "" {
			return placement.HashString(s), byAffinity
		}
	}
	if len(body) > 0 {
		if _, k := c.prompt().read(body, sp); len(k) > 0 {
			return placement.HashBytes(k), byAffinity
		}
		if s := c.sessionID(h.led, body, body, nil); s != "" {
			return placement.HashString(s), byAffinity
		}
	}
	return rand.Uint64(), byNone
}

// ruleField names a router model request's rule in its refusal's log
// line; nothing for a plain model.
func (fr *frontReq) ruleField() zap.Field {
	if fr.rule == nil {
		return zap.Skip()
	}
	return zap.String("rule", fr.rule.name)
}
