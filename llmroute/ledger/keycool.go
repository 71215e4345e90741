package ledger

import (
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Provider key pools: each key of a provider's `keys` has a cooldown (a
// key the provider refused is left out for a while) and a use count (for
// least_used rotation). They are pooled by provider and key hash, never by
// the key, so a reload keeps them, and with Redis the cooldowns are shared
// under the same name (scope "key/<provider>/<hash>").

// keyPool is "key/<provider>/<hash>" → *KeyState.
var keyPool = caddy.NewUsagePool()

// KeyState is one provider key's cooldown and use count.
type KeyState struct {
	scope string       // its name in keyPool and its backoff scope in Redis
	until atomic.Int64 // unix nanos: cooling until then
	used  atomic.Int64 // requests sent with the key in this process
}

// KeyScope names a provider key by its provider and its hash.
func KeyScope(provider, hash string) string { return "key/" + provider + "/" + hash }

// NewKeyState returns a key state outside the pool: for a test.
func NewKeyState(scope string) *KeyState { return &KeyState{scope: scope} }

// CoolingLeft returns how long the key is still left out (≤ 0: usable).
func (k *KeyState) CoolingLeft(now time.Time) time.Duration {
	return time.Duration(k.until.Load() - now.UnixNano())
}

// Used returns the requests sent with the key so far; Use counts one.
func (k *KeyState) Used() int64 { return k.used.Load() }
func (k *KeyState) Use()        { k.used.Add(1) }

// coolUntil leaves the key out until at least until (unix nanos): a
// cooldown only ever grows, whoever set it.
func (k *KeyState) coolUntil(until int64) {
	for {
		cur := k.until.Load()
		if cur >= until || k.until.CompareAndSwap(cur, until) {
			return
		}
	}
}

// Destruct satisfies caddy.Destructor.
func (k *KeyState) Destruct() error { return nil }

// AdoptKey returns the pooled state of scope (KeyScope), made on first
// use, and records the reference.
func (p *PoolRefs) AdoptKey(scope string) *KeyState {
	v, _ := keyPool.LoadOrStore(scope, &KeyState{scope: scope})
	p.keys = append(p.keys, scope)
	return v.(*KeyState)
}

func (*memoryLedger) CoolKey(k *KeyState, now time.Time, d time.Duration) {
	k.coolUntil(now.Add(d).UnixNano())
}

// CoolKey cools the key here and tells the fleet, off the request path:
// the other instances leave it out as long.
func (l *redisLedger) CoolKey(k *KeyState, now time.Time, d time.Duration) {
	k.coolUntil(now.Add(d).UnixNano())
	l.f.shareBackoff(k.scope, 0, d)
}
