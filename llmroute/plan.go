package llmroute

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// POST /llm_route/plan answers what loading a candidate config would do to
// the running llm_route handlers, and applies nothing. The candidate is
// checked the way POST /load checks a config (decoded strictly, every app
// and module provisioned and validated in a context of its own that is
// then cancelled, never started), so an invalid one gets /load's 400 and
// message. It is not started: a listener that cannot bind is found by
// /load only.
//
// Handlers are matched by where they sit in the config: server name, then
// route and handler index, through subroutes (e.g.
// `srv0/routes/0/handle/0`). When one handler is left unmatched on each
// side (a route was added in front of the only llm_route), those two are
// matched too.

var planMu sync.Mutex

// maxPlanBody bounds a candidate config, as Caddy bounds /load's.
const maxPlanBody = 100 << 20

func (adminAPI) handlePlan(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed")}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPlanBody+1))
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("reading request body: %v", err)}
	}
	if len(body) > maxPlanBody {
		return caddy.APIError{HTTPStatus: http.StatusRequestEntityTooLarge, Err: errors.New("config too large")}
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if body, err = adaptConfig(ct, body); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
	}
	// One plan at a time: each points Caddy's default log at its candidate's
	// and back (restoreLogging).
	planMu.Lock()
	logging, logOK := runningLogging(r)
	cfgJSON, err := checkCandidate(body)
	if logOK {
		restoreLogging(logging)
	}
	planMu.Unlock()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("loading config: %v", err)}
	}
	p, err := planFor(cfgJSON, time.Now())
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	return writeAdminJSON(w, p)
}

// adaptConfig adapts a body of another format to JSON by its Content-Type,
// as /load does (text/caddyfile → the caddyfile adapter), with /load's
// messages.
func adaptConfig(contentType string, body []byte) ([]byte, error) {
	ct, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return nil, fmt.Errorf("invalid Content-Type: %v", err)
	}
	if strings.HasSuffix(ct, "/json") {
		return body, nil
	}
	_, name, ok := strings.Cut(ct, "/")
	if !ok {
		return nil, errors.New("malformed Content-Type")
	}
	a := caddyconfig.GetAdapter(name)
	if a == nil {
		return nil, fmt.Errorf("unrecognized config adapter '%s'", name)
	}
	out, _, err := a.Adapt(body, nil)
	if err != nil {
		return nil, fmt.Errorf("adapting config using %s adapter: %v", name, err)
	}
	return out, nil
}

// checkCandidate checks a config as /load would and returns it with its
// meta fields (@id) removed; the error text is what /load puts after
// "loading config: ".
func checkCandidate(body []byte) ([]byte, error) {
	var val any
	if err := json.Unmarshal(body, &val); err != nil {
		if se, ok := err.(*json.SyntaxError); ok {
			return nil, fmt.Errorf("decoding request body: %w, at offset %d", se, se.Offset)
		}
		return nil, fmt.Errorf("decoding request body: %w", err)
	}
	norm, err := json.Marshal(val)
	if err != nil {
		return nil, fmt.Errorf("encoding new config: %v", err)
	}
	if err := indexIDs(val, "/config", map[string]string{}); err != nil {
		return nil, fmt.Errorf("indexing config: %v", err)
	}
	stripped := caddy.RemoveMetaFields(norm)
	var cfg *caddy.Config
	if err := caddy.StrictUnmarshalJSON(stripped, &cfg); err != nil {
		return nil, fmt.Errorf("loading new config: %v", err)
	}
	if cfg == nil {
		cfg = new(caddy.Config)
	}
	// Provisioning a config points CertMagic's default storage at the
	// config's storage; the running config's must stay in place.
	storage := certmagic.Default.Storage
	err = caddy.Validate(cfg)
	certmagic.Default.Storage = storage
	if err != nil {
		return nil, fmt.Errorf("loading new config: %v", err)
	}
	return stripped, nil
}

// Provisioning a config (caddy.Validate as much as a load) points Caddy's
// own default log at the config's, and cancelling it closes those log
// writers: after checking a candidate, Caddy's log would go to the
// candidate's writers, closed. runningLogging reads the running config's
// logging block from this admin endpoint, and restoreLogging provisions it
// alone, which points the default log back at writers the running config
// holds open (writers are shared by what they write to). Nothing else of
// that throwaway config is kept.

// runningLogging reads the running config's logging from the admin
// endpoint r came in on; ok is false when it cannot (an endpoint this
// process cannot call back, such as a remote one with client certificates).
func runningLogging(r *http.Request) (json.RawMessage, bool) {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return nil, false
	}
	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, la.Network(), la.String())
		}, DisableKeepAlives: true},
	}
	host := r.Host
	if host == "" {
		host = "127.0.0.1"
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+host+"/config/logging", nil)
	if err != nil {
		return nil, false
	}
	if o := r.Header.Get("Origin"); o != "" {
		req.Header.Set("Origin", o)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK || !json.Valid(b) {
		return nil, false
	}
	return b, true
}

// restoreLogging points Caddy's default log back at the running config's
// logging (see runningLogging).
func restoreLogging(logging json.RawMessage) {
	storage := certmagic.Default.Storage
	defer func() { certmagic.Default.Storage = storage }()
	var cfg *caddy.Config
	if err := caddy.StrictUnmarshalJSON([]byte(`{"logging":`+strings.TrimSpace(string(logging))+`}`), &cfg); err != nil || cfg == nil {
		return
	}
	if err := caddy.Validate(cfg); err != nil {
		caddy.Log().Warn("llm_route plan: restoring the running log settings", zap.Error(err))
	}
}

// indexIDs rejects a repeated @id as /load does.
func indexIDs(v any, at string, seen map[string]string) error {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == "@id" {
				var id string
				switch x := v[k].(type) {
				case string:
					id = x
				case float64:
					id = fmt.Sprintf("%v", x)
				default:
					return fmt.Errorf("%s: @id field must be a string or number", at)
				}
				if prev, ok := seen[id]; ok {
					return fmt.Errorf("duplicate ID '%s' found at %s and %s", id, prev, at)
				}
				seen[id] = at
				continue
			}
			if err := indexIDs(v[k], at+"/"+k, seen); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range v {
			if err := indexIDs(e, at+"/"+strconv.Itoa(i), seen); err != nil {
				return err
			}
		}
	}
	return nil
}

// The plan's JSON.
type (
	planAnswer struct {
		Handlers []handlerPlan `json:"handlers"`
		// Valid is true: an invalid candidate is a 400 instead.
		Valid bool `json:"valid"`
	}
	handlerPlan struct {
		// Path is where the handler sits (in the candidate; in the running
		// config for a removed one).
		Path string `json:"path"`
		// Op is "added" or "removed" for a whole handler, absent when it
		// stays.
		Op      string          `json:"op,omitempty"`
		Changes []planChange    `json:"changes"`
		State   []upstreamCarry `json:"state"`
		Notes   []string        `json:"notes,omitempty"`
	}
	planChange struct {
		// Kind is provider, upstream, pool, model, key, handler (its own
		// settings) or state.
		Kind   string        `json:"kind"`
		ID     string        `json:"id"`
		Op     string        `json:"op"` // added, removed, changed
		Fields []fieldChange `json:"fields,omitempty"`
		Note   string        `json:"note,omitempty"`
	}
	fieldChange struct {
		Path string `json:"path"`
		Old  any    `json:"old"`
		New  any    `json:"new"`
		// Secret marks a secret: old and new are "[redacted]" (null when
		// unset), never the value.
		Secret bool `json:"secret,omitempty"`
	}
	upstreamCarry struct {
		Upstream string `json:"upstream"`
		Op       string `json:"op"` // kept, added, removed
		// CarriesOver: the upstream keeps its live state (slots in use,
		// cooling, fail streak; the queued requests of its models).
		CarriesOver    bool    `json:"carries_over"`
		Inflight       int64   `json:"inflight"`
		CoolingSeconds float64 `json:"cooling_seconds"`
		FailStreak     int64   `json:"fail_streak"`
		// Queued counts the requests waiting in the queues of the running
		// models that may go to this upstream.
		Queued int    `json:"queued"`
		Note   string `json:"note,omitempty"`
	}
)

// placedConfig is one llm_route handler's config and where it sits.
type placedConfig struct {
	path string
	cfg  *Handler
}

// planFor compares the running llm_route handlers with the candidate's.
func planFor(candidate []byte, now time.Time) (planAnswer, error) {
	next, err := candidateHandlers(candidate)
	if err != nil {
		return planAnswer{}, err
	}
	cur := runningHandlers()
	pairs := matchHandlers(cur, next)
	snap := snapshot(now)
	ans := planAnswer{Handlers: []handlerPlan{}, Valid: true}
	for _, p := range pairs {
		ans.Handlers = append(ans.Handlers, planHandler(p[0], p[1], snap))
	}
	return ans, nil
}

// matchHandlers pairs running and candidate handlers by path; a lone
// leftover on each side is paired too. A nil side is an added or removed
// handler.
func matchHandlers(cur, next []placedConfig) [][2]*placedConfig {
	var pairs [][2]*placedConfig
	used := make([]bool, len(cur))
	var leftNext []int
	for i := range next {
		j := slices.IndexFunc(cur, func(c placedConfig) bool { return c.path == next[i].path })
		if j < 0 {
			leftNext = append(leftNext, i)
			continue
		}
		used[j] = true
		pairs = append(pairs, [2]*placedConfig{&cur[j], &next[i]})
	}
	var leftCur []int
	for j := range cur {
		if !used[j] {
			leftCur = append(leftCur, j)
		}
	}
	if len(leftCur) == 1 && len(leftNext) == 1 {
		pairs = append(pairs, [2]*placedConfig{&cur[leftCur[0]], &next[leftNext[0]]})
		leftCur, leftNext = nil, nil
	}
	for _, i := range leftNext {
		pairs = append(pairs, [2]*placedConfig{nil, &next[i]})
	}
	for _, j := range leftCur {
		pairs = append(pairs, [2]*placedConfig{&cur[j], nil})
	}
	return pairs
}

// runningHandlers finds the llm_route handlers of the running config with
// the config each was loaded from.
func runningHandlers() []placedConfig {
	app, err := caddy.ActiveContext().AppIfConfigured("http")
	if err != nil {
		return nil
	}
	httpApp, ok := app.(*caddyhttp.App)
	if !ok {
		return nil
	}
	var out []placedConfig
	var walk func(at string, routes caddyhttp.RouteList, errs *caddyhttp.HTTPErrorConfig)
	walk = func(at string, routes caddyhttp.RouteList, errs *caddyhttp.HTTPErrorConfig) {
		for i, rt := range routes {
			for j, mh := range rt.Handlers {
				where := fmt.Sprintf("%s/routes/%d/handle/%d", at, i, j)
				switch h := mh.(type) {
				case *Handler:
					c := new(Handler)
					if decodePlain(h.loadedFrom, c) == nil {
						out = append(out, placedConfig{path: where, cfg: c})
					}
				case *caddyhttp.Subroute:
					walk(where, h.Routes, h.Errors)
				}
			}
		}
		if errs != nil {
			walk(at+"/errors", errs.Routes, nil)
		}
	}
	names := make([]string, 0, len(httpApp.Servers))
	for name := range httpApp.Servers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		srv := httpApp.Servers[name]
		walk(name, srv.Routes, srv.Errors)
	}
	return out
}

// candidateHandlers finds the llm_route handlers of a config's JSON, with
// the same paths as runningHandlers.
func candidateHandlers(cfgJSON []byte) ([]placedConfig, error) {
	type route struct {
		Handle []json.RawMessage `json:"handle"`
	}
	type errorsCfg struct {
		Routes []route `json:"routes"`
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []route    `json:"routes"`
					Errors *errorsCfg `json:"errors"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return nil, fmt.Errorf("reading the candidate's handlers: %v", err)
	}
	var out []placedConfig
	var walkErr error
	var walk func(at string, routes []route, errs *errorsCfg)
	walk = func(at string, routes []route, errs *errorsCfg) {
		for i, rt := range routes {
			for j, raw := range rt.Handle {
				where := fmt.Sprintf("%s/routes/%d/handle/%d", at, i, j)
				var head struct {
					Handler string     `json:"handler"`
					Routes  []route    `json:"routes"`
					Errors  *errorsCfg `json:"errors"`
				}
				if json.Unmarshal(raw, &head) != nil {
					continue
				}
				switch head.Handler {
				case "llm_route":
					var fields map[string]json.RawMessage
					_ = json.Unmarshal(raw, &fields)
					delete(fields, "handler")
					b, _ := json.Marshal(fields)
					c := new(Handler)
					if err := decodePlain(b, c); err != nil && walkErr == nil {
						walkErr = fmt.Errorf("%s: %v", where, err)
					}
					out = append(out, placedConfig{path: where, cfg: c})
				case "subroute":
					walk(where, head.Routes, head.Errors)
				}
			}
		}
		if errs != nil {
			walk(at+"/errors", errs.Routes, nil)
		}
	}
	names := make([]string, 0, len(cfg.Apps.HTTP.Servers))
	for name := range cfg.Apps.HTTP.Servers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		srv := cfg.Apps.HTTP.Servers[name]
		walk(name, srv.Routes, srv.Errors)
	}
	return out, walkErr
}

// decodePlain decodes a handler's config without keeping it as loaded.
func decodePlain(b []byte, h *Handler) error {
	type plain Handler
	return decodeStrictly(b, (*plain)(h))
}

// redacted stands for a secret's value in a plan.
const redacted = "[redacted]"

// planHandler is the plan of one handler: cur is nil when it is added,
// next when it is removed.
func planHandler(cur, next *placedConfig, snap statusSnapshot) handlerPlan {
	a, b := new(Handler), new(Handler)
	hp := handlerPlan{Changes: []planChange{}, State: []upstreamCarry{}}
	switch {
	case cur == nil:
		hp.Path, hp.Op, b = next.path, "added", next.cfg
	case next == nil:
		hp.Path, hp.Op, a = cur.path, "removed", cur.cfg
	default:
		hp.Path, a, b = next.path, cur.cfg, next.cfg
	}

	hp.Changes = append(hp.Changes, diffList("provider", a.Providers, b.Providers, func(p Provider) string { return p.ID }, providerSecret)...)
	hp.Changes = append(hp.Changes, diffList("upstream", a.Upstreams, b.Upstreams, func(u Upstream) string { return u.ID }, noSecret)...)
	hp.Changes = append(hp.Changes, diffList("pool", a.Pools, b.Pools, func(p Pool) string { return p.ID }, noSecret)...)
	models := diffList("model", a.Models, b.Models, func(m Model) string { return m.Name }, noSecret)
	hp.Changes = append(hp.Changes, chainNotes(models, a, b)...)
	keys := diffList("key", a.Keys, b.Keys, func(k ClientKey) string { return k.ID }, keySecret)
	for i := range keys {
		if keys[i].Op == "changed" && slices.ContainsFunc(keys[i].Fields, func(f fieldChange) bool { return keyLimit[strings.SplitN(f.Path, ".", 2)[0]] }) {
			keys[i].Note = "its limits change; its counters carry over"
		}
	}
	hp.Changes = append(hp.Changes, keys...)
	if f := handlerSettings(a, b); len(f) > 0 {
		hp.Changes = append(hp.Changes, planChange{Kind: "handler", Op: "changed", Fields: f})
	}
	newFleet := false
	if f := diffObjects(a.State, b.State, stateSecret); len(f) > 0 {
		c := planChange{Kind: "state", Op: "changed", Fields: f}
		if fleetOf(a.State) != fleetOf(b.State) {
			newFleet = true
			c.Note = "a new fleet starts; the old one drains"
			hp.Notes = append(hp.Notes, "state: "+c.Note)
		}
		hp.Changes = append(hp.Changes, c)
	}
	hp.State = carries(a, b, snap, newFleet)
	return hp
}

// keyLimit are the client key fields that are its limits.
var keyLimit = map[string]bool{"rpm": true, "burst": true, "tokens_per_day": true, "spend_per_day": true,
	"spend_per_month": true, "models": true}

// Which fields hold secrets, by path within an entry: never shown, only
// marked as changed.
func noSecret(string) bool { return false }

func providerSecret(path string) bool {
	top, _, _ := strings.Cut(path, ".")
	// Static headers may carry a credential of their own.
	return top == "key" || top == "keys" || top == "headers"
}

func keySecret(path string) bool {
	top, _, _ := strings.Cut(path, ".")
	return top == "secret" || top == "sha256"
}

func stateSecret(path string) bool { return path == "password" }

// diffList compares two lists of entries by id: added, removed (a renamed
// entry is both), and changed with the fields that differ.
func diffList[T any](kind string, old, cur []T, id func(T) string, secret func(string) bool) []planChange {
	out := []planChange{}
	byID := make(map[string]T, len(old))
	for _, e := range old {
		byID[id(e)] = e
	}
	seen := make(map[string]bool, len(cur))
	for _, e := range old {
		if !slices.ContainsFunc(cur, func(n T) bool { return id(n) == id(e) }) {
			out = append(out, planChange{Kind: kind, ID: id(e), Op: "removed"})
		}
	}
	for _, e := range cur {
		seen[id(e)] = true
		o, ok := byID[id(e)]
		if !ok {
			out = append(out, planChange{Kind: kind, ID: id(e), Op: "added"})
			continue
		}
		if f := diffObjects(o, e, secret); len(f) > 0 {
			out = append(out, planChange{Kind: kind, ID: id(e), Op: "changed", Fields: f})
		}
	}
	return out
}

// diffObjects compares two config values field by field (as their JSON).
func diffObjects(old, cur any, secret func(string) bool) []fieldChange {
	a, b := asJSON(old), asJSON(cur)
	var out []fieldChange
	diffValue("", a, b, secret, &out)
	return out
}

// asJSON is v as decoded JSON (maps, slices, numbers, strings), nil for
// an absent or empty value.
func asJSON(v any) any {
	if rv := reflect.ValueOf(v); !rv.IsValid() || (rv.Kind() == reflect.Pointer && rv.IsNil()) {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	_ = d.Decode(&out)
	return out
}

func diffValue(path string, a, b any, secret func(string) bool, out *[]fieldChange) {
	if reflect.DeepEqual(a, b) {
		return
	}
	if path != "" && secret(path) {
		*out = append(*out, fieldChange{Path: path, Old: secretMark(a), New: secretMark(b), Secret: true})
		return
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	// An object that appears or goes is compared field by field too, so
	// that a secret in it is recognised by its path.
	if aok && b == nil {
		bm, bok = map[string]any{}, true
	}
	if bok && a == nil {
		am, aok = map[string]any{}, true
	}
	if aok && bok {
		keys := make([]string, 0, len(am)+len(bm))
		for k := range am {
			keys = append(keys, k)
		}
		for k := range bm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			diffValue(joinPath(path, k), am[k], bm[k], secret, out)
		}
		return
	}
	if an, bn, ok := namedLists(a, b); ok {
		for _, n := range unionNames(an, bn) {
			diffValue(joinPath(path, n), an[n], bn[n], secret, out)
		}
		return
	}
	// A URL may hold user:password@ (a provider's url, a transport's
	// forward proxy): only its redacted form shows, and a change of the
	// credentials alone is a secret's.
	as, _ := a.(string)
	bs, _ := b.(string)
	if withCredentials(as) || withCredentials(bs) {
		if redactURL(as) == redactURL(bs) {
			*out = append(*out, fieldChange{Path: path, Old: redacted, New: redacted, Secret: true})
			return
		}
		a, b = redactedValue(a), redactedValue(b)
	}
	*out = append(*out, fieldChange{Path: path, Old: a, New: b})
}

// withCredentials reports whether s looks like a URL with a user part.
func withCredentials(s string) bool {
	i := strings.Index(s, "://")
	return i > 0 && strings.Contains(s[i:], "@")
}

func redactedValue(v any) any {
	if s, ok := v.(string); ok && withCredentials(s) {
		return redactURL(s)
	}
	return v
}

func joinPath(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// secretMark is what a plan shows of a secret's value.
func secretMark(v any) any {
	if v == nil {
		return nil
	}
	return redacted
}

// namedLists reads two lists of objects with unique names (a router
// model's rules) as maps by name, so a change names the rule.
func namedLists(a, b any) (map[string]any, map[string]any, bool) {
	byName := func(v any) (map[string]any, []string, bool) {
		l, ok := v.([]any)
		if !ok && v != nil {
			return nil, nil, false
		}
		m := make(map[string]any, len(l))
		var order []string
		for _, e := range l {
			o, ok := e.(map[string]any)
			name, _ := o["name"].(string)
			if !ok || name == "" || m[name] != nil {
				return nil, nil, false
			}
			m[name] = o
			order = append(order, name)
		}
		return m, order, true
	}
	am, ao, aok := byName(a)
	bm, bo, bok := byName(b)
	if !aok || !bok || (len(ao) == 0 && len(bo) == 0) || !slices.Equal(commonOrder(ao, bm), commonOrder(bo, am)) {
		// A reordered list is a change of the list itself: order matters.
		return nil, nil, false
	}
	return am, bm, true
}

// commonOrder is the names of order that other has too, in order.
func commonOrder(order []string, other map[string]any) []string {
	var out []string
	for _, n := range order {
		if other[n] != nil {
			out = append(out, n)
		}
	}
	return out
}

func unionNames(a, b map[string]any) []string {
	var out []string
	for n := range a {
		out = append(out, n)
	}
	for n := range b {
		if a[n] == nil {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// handlerSettings compares the handler's own settings (everything but its
// lists and its state block).
func handlerSettings(a, b *Handler) []fieldChange {
	strip := func(h *Handler) map[string]any {
		m, _ := asJSON(h).(map[string]any)
		for _, k := range []string{"providers", "upstreams", "pools", "models", "keys", "state"} {
			delete(m, k)
		}
		return m
	}
	return diffObjects(strip(a), strip(b), noSecret)
}

// fleetOf names the accounting a state block gives: this process's memory,
// or a redis fleet, by everything a fleet is built from (placeholders
// resolved, the password hashed by the ledger's own key is not needed:
// equal text resolves equal).
func fleetOf(s *StateConfig) string {
	if s == nil || s.Backend == "" || s.Backend == "memory" {
		return "memory"
	}
	c, err := s.resolved(caddy.NewReplacer())
	if err != nil {
		return "invalid"
	}
	b, _ := json.Marshal(c)
	return string(b)
}

// chainNotes marks the models whose chain of upstreams changes, including
// through a pool's members, and adds a change for a model whose own
// fields are the same but whose pools changed.
func chainNotes(models []planChange, a, b *Handler) []planChange {
	for _, m := range b.Models {
		i := slices.IndexFunc(a.Models, func(o Model) bool { return o.Name == m.Name })
		if i < 0 {
			continue
		}
		was, is := chainText(a, a.Models[i]), chainText(b, m)
		if was == is {
			continue
		}
		note := "its chain changes: " + was + " → " + is
		j := slices.IndexFunc(models, func(c planChange) bool { return c.ID == m.Name })
		if j < 0 {
			models = append(models, planChange{Kind: "model", ID: m.Name, Op: "changed", Note: note})
			continue
		}
		models[j].Note = note
	}
	return models
}

// chainText renders a model's chain: "a, pool(b, c)"; a router model's
// rules as "rule: m1, m2; …".
func chainText(h *Handler, m Model) string {
	if len(m.Rules) > 0 {
		parts := make([]string, len(m.Rules))
		for i, r := range m.Rules {
			parts[i] = r.Name + ": " + strings.Join(r.Use, ", ")
		}
		return strings.Join(parts, "; ")
	}
	parts := make([]string, len(m.Upstreams))
	for i, id := range m.Upstreams {
		parts[i] = id
		if p := slices.IndexFunc(h.Pools, func(p Pool) bool { return p.ID == id }); p >= 0 {
			parts[i] = id + "(" + strings.Join(h.Pools[p].Upstreams, ", ") + ")"
		}
	}
	return strings.Join(parts, ", ")
}

// carries lists every upstream of either config with its live state and
// whether the candidate keeps it: the same id keeps the pooled state (a
// reload's new config adopts it before the old one lets go), unless the
// state block changes and a new fleet counts the slots.
func carries(a, b *Handler, snap statusSnapshot, newFleet bool) []upstreamCarry {
	live := make(map[string]upstreamStatus, len(snap.Upstreams))
	for _, u := range snap.Upstreams {
		live[u.ID] = u
	}
	queued := make(map[string]int)
	for _, m := range snap.Models {
		for _, id := range m.Upstreams {
			queued[id] += m.QueueDepth
		}
	}
	in := func(h *Handler, id string) bool {
		return slices.ContainsFunc(h.Upstreams, func(u Upstream) bool { return u.ID == id })
	}
	out := []upstreamCarry{}
	add := func(id, op string) {
		u := live[id]
		c := upstreamCarry{Upstream: id, Op: op, Inflight: u.Inflight, CoolingSeconds: u.CoolingSeconds,
			FailStreak: u.FailStreak, Queued: queued[id]}
		switch {
		case op == "removed":
			if c.Inflight > 0 {
				c.Note = strconv.FormatInt(c.Inflight, 10) + " in flight will drain here"
			}
		case op == "added":
			c.Inflight, c.CoolingSeconds, c.FailStreak, c.Queued = 0, 0, 0, 0
			if u.Draining {
				// A removed upstream still draining: the new one takes over its slots.
				c.CarriesOver, c.Inflight = true, u.Inflight
			}
		case newFleet:
			c.Note = "a new fleet counts its slots; the requests in flight finish on the old one"
		default:
			c.CarriesOver = true
		}
		out = append(out, c)
	}
	for _, u := range a.Upstreams {
		if in(b, u.ID) {
			add(u.ID, "kept")
		} else {
			add(u.ID, "removed")
		}
	}
	for _, u := range b.Upstreams {
		if !in(a, u.ID) {
			add(u.ID, "added")
		}
	}
	return out
}
