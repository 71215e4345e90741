package llmroute

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Provider key pools. A provider with `keys` sends each attempt with one
// key that is not cooling. A key the provider refuses for the key's own
// sake (auth, quota, rate) cools for a time that depends on why, and the
// attempt is sent again at once, on the same upstream, with another key:
// the upstream is fine, so it is neither backed off nor failed over. Only
// when every key cools does the attempt fail as the upstream's, and the
// upstream cools until the first key comes back.
//
// The key choice is made where the auth header is set (call.takeKey): a
// provider with one key sends its pre-built header value as before, and a
// pool key's header value is pre-built too, so the choice allocates
// nothing.

// Key rotations.
const (
	rotationRandom     = "random"
	rotationRoundRobin = "round_robin"
	rotationLeastUsed  = "least_used"
)

// Default key cooldowns, by why the provider refused the key.
const (
	defaultKeyCooldownAuth  = 24 * time.Hour
	defaultKeyCooldownQuota = time.Hour
	defaultKeyCooldownRate  = time.Minute
)

// keyFault is why a provider refused a pool key (keyFine: it did not).
type keyFault uint8

const (
	keyFine keyFault = iota
	keyAuth
	keyQuota
	keyRate
	numKeyFaults
)

// Results of llm_proxy_provider_key_requests_total: a key refusal by its
// kind, ok (the provider took the key, whatever the answer), or failed
// (the exchange failed for a reason that is not the key's).
const (
	keyResultOK     = "ok"
	keyResultFailed = "failed"
)

var keyFaultNames = [numKeyFaults]string{keyFine: keyResultOK, keyAuth: "auth", keyQuota: "quota", keyRate: "rate"}

func (f keyFault) String() string { return keyFaultNames[f] }

// keyPool is one provider's compiled keys, shared by its upstreams.
type keyPool struct {
	provider string
	rotation string
	keys     []poolKey
	next     atomic.Uint64 // round_robin's turn
	cooldown [numKeyFaults]time.Duration
}

// poolKey is one key of a pool: its index, fingerprint, pre-built header
// value and pooled state. The key itself is only in authValue.
type poolKey struct {
	index       int
	label       string // the index, as the metric's and the log's key
	fingerprint string // a short hash: tells keys apart, reveals nothing
	authValue   []string
	state       *ledger.KeyState
	// counters are the key's llm_proxy_provider_key_requests_total series
	// by result (keyFault, then failed at numKeyFaults).
	counters [numKeyFaults + 1]prometheus.Counter
}

// keyFingerprint is the short hash of a key shown in the status, and the
// longer one its cooldown is pooled and shared by.
func keyFingerprint(key string) (short, long string) {
	sum := sha256.Sum256([]byte("llm_route provider key\x00" + key))
	long = hex.EncodeToString(sum[:12])
	return long[:8], long
}

// checkKeyPool validates a provider's key pool settings.
func checkKeyPool(bad func(string, ...any), where string, p *Provider) {
	if p.Key != "" && len(p.Keys) > 0 {
		bad("%s: key and keys are both set; use one (keys is a pool of several)", where)
	}
	for i, k := range p.Keys {
		if k == "" {
			bad("%s: keys[%d] is empty", where, i)
		}
	}
	switch p.KeyRotation {
	case "", rotationRandom, rotationRoundRobin, rotationLeastUsed:
	default:
		bad("%s: key_rotation: %q is not random, round_robin or least_used", where, p.KeyRotation)
	}
	for _, c := range []struct {
		name string
		d    *Duration
	}{{"key_cooldown_auth", p.KeyCooldownAuth}, {"key_cooldown_quota", p.KeyCooldownQuota}, {"key_cooldown_rate", p.KeyCooldownRate}} {
		if c.d != nil && *c.d <= 0 {
			bad("%s: %s must be positive", where, c.name)
		}
	}
	if h := p.ClientKeyHeader; h != "" {
		canon := http.CanonicalHeaderKey(h)
		switch {
		case !validHeaderName(h):
			bad("%s: client_key_header %q is not a valid header name", where, h)
		case (&upstream{}).forwardable(canon) || canon == "Authorization" || canon == "Content-Type":
			bad("%s: client_key_header %q names a header the proxy forwards or reads itself; choose another (e.g. X-Provider-Key)", where, h)
		}
	}
}

// compileKeyPool resolves a provider's keys (placeholders included) into
// its pool; nil when the provider has no keys list.
func (h *Handler) compileKeyPool(p *Provider, resolve func(string) string, bearer bool) (*keyPool, error) {
	if len(p.Keys) == 0 {
		return nil, nil
	}
	where := fmt.Sprintf("llm_route config: provider %q", p.ID)
	kp := &keyPool{provider: p.ID, rotation: p.KeyRotation}
	if kp.rotation == "" {
		kp.rotation = rotationRandom
	}
	kp.cooldown[keyAuth] = durationOr(defaultKeyCooldownAuth, p.KeyCooldownAuth)
	kp.cooldown[keyQuota] = durationOr(defaultKeyCooldownQuota, p.KeyCooldownQuota)
	kp.cooldown[keyRate] = durationOr(defaultKeyCooldownRate, p.KeyCooldownRate)
	seen := make(map[string]int, len(p.Keys))
	for i, raw := range p.Keys {
		key := resolve(raw)
		switch {
		case key == "":
			return nil, fmt.Errorf("%s: keys[%d] resolves to empty", where, i)
		case !transform.ValidHeaderValue(key):
			return nil, fmt.Errorf("%s: keys[%d] contains a line break or another control character", where, i)
		}
		if j, dup := seen[key]; dup {
			return nil, fmt.Errorf("%s: keys[%d] is the same key as keys[%d]", where, i, j)
		}
		seen[key] = i
		short, long := keyFingerprint(key)
		auth := key
		if bearer {
			auth = "Bearer " + key
		}
		k := poolKey{index: i, label: strconv.Itoa(i), fingerprint: short, authValue: []string{auth},
			state: h.refs.AdoptKey(ledger.KeyScope(p.ID, long))}
		for f := keyFine; f < numKeyFaults; f++ {
			k.counters[f] = h.metrics.keyRequests.WithLabelValues(p.ID, k.label, f.String())
		}
		k.counters[numKeyFaults] = h.metrics.keyRequests.WithLabelValues(p.ID, k.label, keyResultFailed)
		kp.keys = append(kp.keys, k)
	}
	return kp, nil
}

// pick chooses a key that is not cooling, as the rotation says, and counts
// its use; nil when every key cools.
func (kp *keyPool) pick(now time.Time) *poolKey {
	n := len(kp.keys)
	var k *poolKey
	switch kp.rotation {
	case rotationRoundRobin:
		start := int((kp.next.Add(1) - 1) % uint64(n))
		for i := range n {
			if c := &kp.keys[(start+i)%n]; c.state.CoolingLeft(now) <= 0 {
				k = c
				break
			}
		}
	case rotationLeastUsed:
		for i := range kp.keys {
			c := &kp.keys[i]
			if c.state.CoolingLeft(now) <= 0 && (k == nil || c.state.Used() < k.state.Used()) {
				k = c
			}
		}
	default:
		// Uniform over the keys not cooling: count them, then take the
		// r-th (no list is built).
		free := 0
		for i := range kp.keys {
			if kp.keys[i].state.CoolingLeft(now) <= 0 {
				free++
			}
		}
		if free == 0 {
			return nil
		}
		r := rand.N(free)
		for i := range kp.keys {
			if c := &kp.keys[i]; c.state.CoolingLeft(now) <= 0 {
				if r == 0 {
					k = c
					break
				}
				r--
			}
		}
	}
	if k != nil {
		k.state.Use()
	}
	return k
}

// soonest returns the key that comes back first and how long until it
// does (≤ 0: one is usable now).
func (kp *keyPool) soonest(now time.Time) (*poolKey, time.Duration) {
	var best *poolKey
	var left time.Duration
	for i := range kp.keys {
		k := &kp.keys[i]
		if l := k.state.CoolingLeft(now); best == nil || l < left {
			best, left = k, l
		}
	}
	return best, left
}

// keyFaultOf tells whether an upstream's failed answer is a refusal of the
// key (and of which kind): 401/403 auth; 402, or a quota or billing error
// in the head of the body, quota; any other 429 rate. head is the bounded
// start of the body the call already read (nil: not read).
func keyFaultOf(status int, head []byte) keyFault {
	switch {
	case status == http.StatusPaymentRequired:
		return keyQuota
	case authStatus(status):
		if quotaBody(head) {
			return keyQuota
		}
		return keyAuth
	case status == http.StatusTooManyRequests, status == http.StatusBadRequest:
		if quotaBody(head) {
			return keyQuota
		}
		if status == http.StatusTooManyRequests {
			return keyRate
		}
	}
	return keyFine
}

// quotaMarkers are what the providers' quota and billing errors say:
// OpenAI's insufficient_quota (sent with a 429) and billing codes,
// Anthropic's billing_error and its credit-balance message (a 400),
// OpenRouter's insufficient credits (a 402).
var quotaMarkers = [][]byte{
	[]byte("insufficient_quota"),
	[]byte("billing_hard_limit_reached"),
	[]byte("billing_not_active"),
	[]byte("billing_error"),
	[]byte("credit balance is too low"),
	[]byte("insufficient credits"),
	[]byte("insufficient_credits"),
}

// quotaBody reports an error body that speaks of quota or billing.
func quotaBody(head []byte) bool {
	if len(head) == 0 {
		return false
	}
	lower := bytes.ToLower(head)
	for _, m := range quotaMarkers {
		if bytes.Contains(lower, m) {
			return true
		}
	}
	return false
}

// keyCooldown is how long a key refused for f is left out: a rate limit's
// own Retry-After when it sent one, else the provider's setting.
func (kp *keyPool) keyCooldown(f keyFault, retryAfter time.Duration) time.Duration {
	if f == keyRate && retryAfter > 0 {
		return retryAfter
	}
	return kp.cooldown[f]
}

// coolKey leaves the call's key out after a refusal of kind f, and logs
// it by index. A Retry-After is bounded by retry_after_max, as for an
// upstream: the key's cooldown becomes the upstream's once every key cools.
func (h *Handler) coolKey(u *upstream, k *poolKey, f keyFault, retryAfter time.Duration, status int) {
	d := u.keys.keyCooldown(f, min(retryAfter, h.retryAfterMax))
	u.led.CoolKey(k.state, time.Now(), d)
	if c := h.logger.Check(zapcore.InfoLevel, "provider key cooling"); c != nil {
		c.Write(zap.String("provider", u.Provider), zap.String("upstream", u.ID), zap.Int("key", k.index),
			zap.String("fingerprint", k.fingerprint), zap.String("reason", f.String()), zap.Int("status", status),
			zap.Duration("cooling", d))
	}
}

// countKey counts one exchange sent with a pool key.
func (k *poolKey) count(res *attemptResult) {
	switch {
	case res.keyFault != keyFine:
		k.counters[res.keyFault].Inc()
	case res.out == outFailover:
		k.counters[numKeyFaults].Inc()
	default:
		k.counters[keyFine].Inc()
	}
}

// ownKey is a caller's own key for the providers whose client_key_header
// is hdr (canonical).
type ownKey struct{ hdr, val string }

// takeOwnKeys takes the handler's client key headers out of the request:
// their values are kept for the attempts and the headers removed, so that
// no upstream, no later handler and no access log sees them.
func (h *Handler) takeOwnKeys(r *http.Request) []ownKey {
	var own []ownKey
	for _, name := range h.ownKeyHdrs {
		if vv, ok := r.Header[name]; ok {
			if len(vv) > 0 && vv[0] != "" {
				own = append(own, ownKey{hdr: name, val: vv[0]})
			}
			delete(r.Header, name)
		}
	}
	return own
}

// takeKey chooses the call's key: the caller's own for this provider (its
// client_key_header), else one of the provider's pool that is not
// cooling, else the provider's one key. false: every key of the pool
// cools.
func (c *call) takeKey() bool {
	u := c.u
	c.keyed, c.auth, c.key, c.ownKey = true, u.authValue, nil, false
	if u.ownKeyHdr != "" {
		for _, o := range c.own {
			if o.hdr == u.ownKeyHdr && transform.ValidHeaderValue(o.val) {
				c.auth, c.ownKey = []string{u.authPrefix + o.val}, true
				return true
			}
		}
	}
	if u.keys == nil {
		return true
	}
	if c.key = u.keys.pick(time.Now()); c.key == nil {
		return false
	}
	c.auth = c.key.authValue
	return true
}

// providerKeyStatus is one pool key in the status: never the key.
type providerKeyStatus struct {
	Index       int     `json:"index"`
	Fingerprint string  `json:"fingerprint"`
	State       string  `json:"state"` // ok or cooling
	Cooling     float64 `json:"cooldown_seconds"`
}

// status lists the pool's keys as the status shows them.
func (kp *keyPool) status(now time.Time) []providerKeyStatus {
	out := make([]providerKeyStatus, 0, len(kp.keys))
	for i := range kp.keys {
		k := &kp.keys[i]
		st := providerKeyStatus{Index: k.index, Fingerprint: k.fingerprint, State: "ok"}
		if left := k.state.CoolingLeft(now); left > 0 {
			st.State, st.Cooling = "cooling", float64(left.Milliseconds())/1000
		}
		out = append(out, st)
	}
	return out
}

// nextKey decides on a run's exchange whose pool key the provider refused
// (the key cools already): while a key of the pool is not cooling, the run
// sends again at once with another (the refusal counted, the upstream
// neither backed off nor failed over). Once every key cools, the run ends
// as one failure of the upstream, which is held until the first key comes
// back (a rate limit's Retry-After, when that key's cooldown came from
// one).
func (h *Handler) nextKey(rt *route, t *target, res *attemptResult, run *retryRun, now time.Time) bool {
	u := t.up
	run.keys++
	_, left := u.keys.soonest(now)
	if left <= 0 && run.keys < len(u.keys.keys) {
		h.countAttempt(rt, t, *res)
		if c := h.logger.Check(zapcore.InfoLevel, "retrying with another provider key"); c != nil {
			c.Write(zap.String("model", rt.name), zap.String("upstream", u.ID), zap.String("result", res.result),
				zap.Int("status", res.status), zap.String("reason", res.keyFault.String()), optionalString("key", res.key))
		}
		return true
	}
	if left > 0 && !u.keysGone(now, left) {
		// Another request already found this pool empty and counted the
		// upstream's failure: one exhaustion is one failure, however many
		// requests were refused together (else the backoff would double
		// once per request).
		res.noBlame = true
	}
	h.holdForKeys(u, now)
	return false
}

// keysGone reports whether the caller is the first to find every key of
// u's pool cooling since they last came back (left from now); only that
// request counts the upstream's failure.
func (u *upstream) keysGone(now time.Time, left time.Duration) bool {
	for {
		old := u.keysGoneUntil.Load()
		if old > now.UnixNano() {
			return false
		}
		if u.keysGoneUntil.CompareAndSwap(old, now.Add(left).UnixNano()) {
			return true
		}
	}
}

// keysCooling is an attempt on an upstream all of whose pool keys cool
// (another instance cooled the last, or the keys' cooldowns outlast the
// upstream's hold): nothing is sent, the upstream is held until the
// first key comes back, and the request fails over without blame.
func (h *Handler) keysCooling(u *upstream) attemptResult {
	h.holdForKeys(u, time.Now())
	return attemptResult{out: outFailover, result: result429, noBlame: true, counted: true}
}

// holdForKeys cools u until the first of its pool's keys comes back.
func (h *Handler) holdForKeys(u *upstream, now time.Time) {
	k, left := u.keys.soonest(now)
	if left <= 0 {
		return
	}
	u.led.Hold(&u.Upstream, now, left)
	if c := h.logger.Check(zapcore.InfoLevel, "every provider key cooling, upstream held"); c != nil {
		c.Write(zap.String("upstream", u.ID), zap.String("provider", u.Provider), zap.Int("first_key", k.index),
			zap.Duration("cooling", left))
	}
}

// keyPoolOf is the key pool of a provider of this config (nil: none, or
// no upstream uses the provider).
func (h *Handler) keyPoolOf(provider string) *keyPool {
	for _, u := range h.table.upstreams {
		if u.Provider == provider {
			return u.keys
		}
	}
	return nil
}
