package llmroute

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/placement"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/anthropic"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/gemini"
)

// ClientKey is a key clients present to use the handler. With
// any key configured, every API request needs one.
type ClientKey struct {
	// ID labels the key in logs, metrics and the status API; it is never
	// secret. Unique among keys. The key's counters (rate, tokens, spend)
	// are kept by ID across reloads.
	ID string `json:"id"`

	// Secret is the key clients send, as `Authorization: Bearer <secret>`
	// or `x-api-key: <secret>`. Placeholders are resolved once at provision
	// time (`{env.NAME}`, `{file./path}`); prefer them, or SHA256, because a
	// literal secret is visible in Caddy's `GET /config/`. Exactly one of
	// Secret and SHA256 is required.
	Secret string `json:"secret,omitempty"`

	// SHA256 is the hex SHA-256 digest of the secret (64 hex digits), so
	// that the config holds no secret at all: `printf %s "$KEY" | sha256sum`.
	SHA256 string `json:"sha256,omitempty"`

	// Models are the model names the key may use; `*` matches any run of
	// characters (`/` included), the pattern is anchored at both ends.
	// Default (absent): every model. The model list answers only these.
	Models []string `json:"models,omitempty"`

	// RPM is the key's request rate, requests per minute on average (GCRA).
	// Default 0: no rate limit.
	RPM int64 `json:"rpm,omitempty"`

	// Burst is how many requests the key may send at once before the rate
	// applies. Default 1.
	Burst int64 `json:"burst,omitempty"`

	// TokensPerDay bounds the input + output tokens the upstreams report
	// for the key per UTC day. Default 0: no limit.
	TokensPerDay int64 `json:"tokens_per_day,omitempty"`

	// SpendPerDay bounds the key's spend per UTC day, in USD, priced with
	// the upstreams' price_* fields. Default 0: no limit.
	SpendPerDay float64 `json:"spend_per_day,omitempty"`

	// SpendPerMonth bounds the key's spend per UTC calendar month, in USD.
	// Default 0: no limit.
	SpendPerMonth float64 `json:"spend_per_month,omitempty"`

	// Labels are attributes the router sets on every request made with
	// this key, e.g. `{"team": "billing"}`, for router models' rules to
	// match. Names are lower-case and not `key` (the router sets that to
	// the key's id). A client can never set or override a label name, in
	// the body or in an X-LLM-Attr-* header, whatever key it uses.
	// Default: none.
	Labels map[string]string `json:"labels,omitempty"`
}

// clientKey is a ClientKey compiled: its hash, which models it may use and
// its limits.
type clientKey struct {
	id     string
	idAny  any // id boxed once, for the placeholder
	hash   [sha256.Size]byte
	all    bool            // no models list: every model
	models map[string]bool // the config's model names the key may use
	rate   keys.Rate
	budget keys.Budget
	// labels are the key's labels (router model attributes); idHash is
	// placement.HashString(id), a weighted rule's sticky key.
	labels map[string]string
	idHash uint64
	// narrow maps a router model's chain route that reaches a model the
	// key may not use to the chain without it; nil entry: no model left
	// (rules.go narrowChains).
	narrow map[*route]*route

	modelsBody, anthropicModels, geminiModels []byte // GET …/models for this key, pre-encoded

	// The key's token series (input, output, cached_input, reasoning) and
	// spend series, looked up once instead of hashing labels per request.
	tokens [4]prometheus.Counter
	spend  prometheus.Counter
	// hist is the key's ring of the last minutes (history.go).
	hist *history
}

// allows reports whether the key may use the model named name.
func (k *clientKey) allows(name string) bool { return k.all || k.models[name] }

// provisionKeys compiles h.Keys: it resolves secrets, checks every entry
// (naming it) and adopts each key's account in the store. It runs after
// the routes are built, since a key's models are matched against them.
func (h *Handler) provisionKeys() error {
	if len(h.Keys) == 0 {
		return nil
	}
	if err := h.metricsForKeys(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	h.keys = make(map[[sha256.Size]byte]*clientKey, len(h.Keys))
	ids := make(map[string]bool, len(h.Keys))
	for i, kc := range h.Keys {
		where := namedEntry(bad, ids, "key", i, "id", kc.ID)
		k := &clientKey{id: kc.ID, idAny: kc.ID, all: kc.Models == nil,
			rate: keys.Rate{PerMinute: kc.RPM, Burst: kc.Burst},
			budget: keys.Budget{TokensPerDay: kc.TokensPerDay,
				SpendPerDay: keys.USD(kc.SpendPerDay), SpendPerMonth: keys.USD(kc.SpendPerMonth)}}
		k.labels, k.idHash = kc.Labels, placement.HashString(kc.ID)
		labelNames := make([]string, 0, len(kc.Labels))
		for name := range kc.Labels {
			labelNames = append(labelNames, name)
		}
		sort.Strings(labelNames)
		for _, name := range labelNames {
			switch {
			case name == "key":
				bad("%s: labels: %q is set by the router", where, name)
			case name == "" || strings.ToLower(name) != name:
				bad("%s: labels: name %q must be lower-case", where, name)
			}
		}
		switch {
		case kc.Secret != "" && kc.SHA256 != "":
			bad("%s: set secret or sha256, not both", where)
		case kc.Secret != "":
			secret := resolveSecret(repl, kc.Secret)
			if secret == "" {
				bad("%s: secret is empty once its placeholders are resolved", where)
			}
			k.hash = sha256.Sum256([]byte(secret))
		case kc.SHA256 != "":
			b, err := hex.DecodeString(kc.SHA256)
			if err != nil || len(b) != sha256.Size {
				bad("%s: sha256 must be 64 hex digits", where)
			}
			copy(k.hash[:], b)
		default:
			bad("%s: secret or sha256 is required", where)
		}
		if _, dup := h.keys[k.hash]; dup && k.hash != ([sha256.Size]byte{}) {
			bad("%s: the same secret as another key", where)
		}
		for _, v := range []struct {
			name string
			n    float64
		}{{"rpm", float64(kc.RPM)}, {"burst", float64(kc.Burst)}, {"tokens_per_day", float64(kc.TokensPerDay)},
			{"spend_per_day", kc.SpendPerDay}, {"spend_per_month", kc.SpendPerMonth}} {
			if v.n < 0 {
				bad("%s: %s must not be negative", where, v.name)
			}
		}
		if kc.Burst > 0 && kc.RPM == 0 {
			bad("%s: burst needs rpm", where)
		}
		if !k.all {
			k.models = make(map[string]bool)
			for _, p := range kc.Models {
				matched := false
				for _, name := range h.table.modelList {
					if globMatch(p, name) {
						k.models[name], matched = true, true
					}
				}
				if !matched {
					h.logger.Warn("key model pattern matches no model", zap.String("key", kc.ID), zap.String("pattern", p))
				}
			}
			var names []string
			for _, name := range h.table.modelList {
				if k.models[name] {
					names = append(names, name)
				}
			}
			k.modelsBody = modelsListBody(names, h.table.created)
			k.anthropicModels = anthropic.ModelsBody(names, time.Unix(h.table.created, 0))
			k.geminiModels = gemini.ModelsBody(names)
		}
		h.narrowChains(k)
		for i, typ := range tokenTypes {
			k.tokens[i] = keyMetrics.tokens.WithLabelValues(k.id, typ)
		}
		k.spend = keyMetrics.spend.WithLabelValues(k.id)
		if h.keyHist == nil {
			h.keyHist = make(map[string]*history)
		}
		k.hist = h.adoptHistory("key/"+k.id, kFields)
		h.keyHist[k.id] = k.hist
		h.keys[k.hash] = k
	}
	if len(errs) > 0 {
		h.keys = nil
		return fmt.Errorf("llm_route config: %s", strings.Join(errs, "; "))
	}
	var created []string
	for _, k := range h.keys {
		if ledger.LocalKeys().Acquire(k.id) {
			created = append(created, k.id)
		}
		h.keyIDs = append(h.keyIDs, k.id)
	}
	h.keyStore = h.led.Keys()
	if h.led.Status().Backend == "memory" {
		if st := storageOf(h.ctx); st != nil {
			h.restoreKeyUsage(st, created)
		}
	}
	return nil
}

// releaseKeys saves the keys' usage and drops this instance's references
// to the key accounts.
func (h *Handler) releaseKeys() {
	h.saveKeyUsage()
	for _, id := range h.keyIDs {
		ledger.LocalKeys().Release(id)
	}
	h.keyIDs = nil
}

// globMatch reports whether name matches pattern as a whole, `*` matching
// any run of characters.
func globMatch(pattern, name string) bool {
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return pattern == name
	}
	prefix, rest := pattern[:star], pattern[star+1:]
	if !strings.HasPrefix(name, prefix) {
		return false
	}
	name = name[len(prefix):]
	for i := 0; i <= len(name); i++ {
		if globMatch(rest, name[i:]) {
			return true
		}
	}
	return false
}

// Refusals of client keys.
var (
	errInvalidKey = apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
		message: "missing or unknown API key; send it as Authorization: Bearer <key>, x-api-key or x-goog-api-key"}
)

func errModelNotAllowed(model string) apiError {
	return apiError{status: http.StatusForbidden, typ: "invalid_request_error", code: "model_not_allowed",
		message: "this API key may not use model " + strconv.Quote(model)}
}

func errRateLimited(retry time.Duration) apiError {
	return apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "rate_limit_exceeded",
		message: "request rate of this API key exceeded", retryAfter: ceilSeconds(retry)}
}

func errOverBudget(l keys.Limit, retry time.Duration) apiError {
	if l == keys.LimitUnavailable { // the shared state is away and on_state_error is reject
		return errAllBusy
	}
	return apiError{status: http.StatusTooManyRequests, typ: "insufficient_quota", code: "insufficient_quota",
		message: "this API key's " + l.String() + " budget is used up", retryAfter: ceilSeconds(retry)}
}

// ceilSeconds is d in whole seconds, rounded up, at least 1.
func ceilSeconds(d time.Duration) int {
	return max(int((d+time.Second-1)/time.Second), 1)
}

// authenticate finds the request's client key — Authorization: Bearer,
// else X-Api-Key, else X-Goog-Api-Key, else the `key` query parameter
// (Google's) — and deletes all of them from the request, so that no
// upstream and no later handler ever sees it (Caddy's access log copies
// the request before any handler: its log filter hides them there). A
// missing or unknown key is answered 401 in the front's shape and
// reported as nil.
//
// The lookup is by SHA-256 of the presented secret: the map compares
// digests, never secrets, and the match is confirmed in constant time,
// so timing reveals nothing about a configured secret.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request, f front) *clientKey {
	secret := r.Header.Get("X-Api-Key")
	if secret == "" {
		secret = r.Header.Get("X-Goog-Api-Key")
	}
	if q := stripKeyQuery(r); secret == "" {
		secret = q
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
			secret = strings.TrimSpace(auth[7:])
		}
	}
	delete(r.Header, "Authorization") // canonical names: no Del's canonicalising
	delete(r.Header, "X-Api-Key")
	delete(r.Header, "X-Goog-Api-Key")
	if secret != "" {
		sum := sha256.Sum256([]byte(secret))
		if k := h.keys[sum]; k != nil && subtle.ConstantTimeCompare(sum[:], k.hash[:]) == 1 {
			h.tagRequest(r, k)
			return k
		}
	}
	h.refuse(w, r, keyErrorFront(r, f), errInvalidKey, zap.Bool("key_sent", secret != ""))
	return nil
}

// tagRequest names the key in the request's access log line (field
// llm_route_key) and in the {http.llm_route.key} placeholder.
func (h *Handler) tagRequest(r *http.Request, k *clientKey) {
	ctx := r.Context()
	if extra, ok := ctx.Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
		extra.Set(zap.String("llm_route_key", k.id))
	}
	if repl, ok := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.llm_route.key", k.idAny)
	}
}

// refuseKey answers a refusal for k on model and counts it in the key's
// requests too.
func (h *Handler) refuseKey(w http.ResponseWriter, r *http.Request, f front, k *clientKey, model string, e apiError) {
	keyMetrics.requests.WithLabelValues(k.id, model, e.code).Inc()
	h.refuse(w, r, keyErrorFront(r, f), e, zap.String("model", model))
}

// keyStatus is one client key in GET /llm_route/status: what it used in
// the current UTC periods, what running requests hold, and its limits
// (null = none). Never the secret.
type keyStatus struct {
	ID             string   `json:"id"`
	TokensToday    int64    `json:"tokens_today"`
	SpendTodayUSD  float64  `json:"spend_today_usd"`
	SpendMonthUSD  float64  `json:"spend_month_usd"`
	ReservedTokens int64    `json:"reserved_tokens"`
	ReservedUSD    float64  `json:"reserved_usd"`
	RPM            *int64   `json:"rpm"`
	TokensPerDay   *int64   `json:"tokens_per_day"`
	SpendPerDay    *float64 `json:"spend_per_day"`
	SpendPerMonth  *float64 `json:"spend_per_month"`
}

// keyStatuses reads the keys of the running handlers, newest config first,
// each id once.
func keyStatuses(live []registryEntry, now time.Time) []keyStatus {
	var out []keyStatus
	seen := make(map[string]bool)
	for _, e := range live {
		h := e.h
		for _, kc := range h.Keys { // config order
			if seen[kc.ID] || h.keyStore == nil {
				continue
			}
			seen[kc.ID] = true
			u := h.keyStore.Usage(kc.ID, now)
			ks := keyStatus{ID: kc.ID, TokensToday: u.TokensToday, SpendTodayUSD: float64(u.SpendToday) / 1e9,
				SpendMonthUSD: float64(u.SpendMonth) / 1e9, ReservedTokens: u.ReservedToken, ReservedUSD: float64(u.ReservedSpend) / 1e9}
			if kc.RPM > 0 {
				ks.RPM = &kc.RPM
			}
			if kc.TokensPerDay > 0 {
				ks.TokensPerDay = &kc.TokensPerDay
			}
			if kc.SpendPerDay > 0 {
				ks.SpendPerDay = &kc.SpendPerDay
			}
			if kc.SpendPerMonth > 0 {
				ks.SpendPerMonth = &kc.SpendPerMonth
			}
			out = append(out, ks)
		}
	}
	return out
}

// keyListing answers the model list for a key with a models list, and
// refuses GET …/models/{id} for a model the key may not use; it reports
// whether it answered.
func (h *Handler) keyListing(w http.ResponseWriter, r *http.Request, f front, k *clientKey, id string) bool {
	if k.all {
		return false
	}
	switch f {
	case frontModels:
		if r.Header.Get("Anthropic-Version") != "" {
			writeJSON(w, http.StatusOK, k.anthropicModels)
		} else {
			writeJSON(w, http.StatusOK, k.modelsBody)
		}
		return true
	case frontModel:
		if h.table.routes[id] != nil && !k.allows(id) {
			h.refuseKey(w, r, f, k, id, errModelNotAllowed(id))
			return true
		}
	case frontGeminiModels:
		if id == "" {
			writeJSON(w, http.StatusOK, k.geminiModels)
			return true
		}
		if h.table.routes[id] != nil && !k.allows(id) {
			h.refuseKey(w, r, f, k, id, errModelNotAllowed(id))
			return true
		}
	}
	return false
}
