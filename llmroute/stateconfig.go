package llmroute

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/redisstate"
)

// StateConfig selects and configures the state backend.
type StateConfig struct {
	// Backend is `memory` (default: each process keeps its own accounting)
	// or `redis` (upstream slots, provider capacity, backoff and Retry-After
	// holds, client-key rate limits and budget reservations, and the session
	// registry are shared by every instance on the same Redis and prefix).
	Backend string `json:"backend,omitempty"`

	// Address is the Redis `host:port`. Default `127.0.0.1:6379`.
	Address string `json:"address,omitempty"`

	// Username for Redis ACLs. Default none. Placeholders (`{env.NAME}`,
	// `{file./path}`) are resolved at load time.
	Username string `json:"username,omitempty"`

	// Password for Redis. Default none. Placeholders are resolved at load
	// time; prefer them to a literal (visible in `GET /config/`). Never
	// logged.
	Password string `json:"password,omitempty"`

	// DB is the Redis database number. Default 0.
	DB int `json:"db,omitempty"`

	// Prefix starts every key and the pub/sub channel. Default `llm_route:`.
	// Instances share state exactly when they use the same Redis and prefix.
	Prefix string `json:"prefix,omitempty"`

	// TLS connects to Redis over TLS with the system's CAs. Default false.
	TLS bool `json:"tls,omitempty"`

	// Timeout bounds every Redis call, connecting included; a call that
	// takes longer counts as Redis being unreachable. Default 50ms.
	Timeout *Duration `json:"timeout,omitempty"`

	// LeaseTTL is how long a slot lease or a client key's budget
	// reservation outlives its instance: leases are renewed every third of
	// it while the instance runs (a reservation until it is settled), so
	// the slots and reservations of a crashed instance, or a reservation
	// whose settlement never reached Redis, come back within it. Default 30s.
	LeaseTTL *Duration `json:"lease_ttl,omitempty"`

	// OnStateError is what happens while Redis is unreachable or slow:
	// `local` (default: this instance falls back to its own accounting with
	// the same limits and goes back to Redis by itself when it answers) or
	// `reject` (requests get 503 until Redis is back).
	OnStateError string `json:"on_state_error,omitempty"`
}

// Defaults of the shared-state (redis) options.
const (
	defaultStateAddress = "127.0.0.1:6379"
	defaultStatePrefix  = "llm_route:"
	defaultStateTimeout = 50 * time.Millisecond
	defaultLeaseTTL     = 30 * time.Second
)

// resolved returns the config with defaults filled in and placeholders
// resolved, or an error naming the bad field.
func (c StateConfig) resolved(repl *caddy.Replacer) (StateConfig, error) {
	switch c.Backend {
	case "", "memory", "redis":
	default:
		return c, fmt.Errorf("llm_route config: state: backend must be memory or redis, not %q", c.Backend)
	}
	switch c.OnStateError {
	case "", "local", "reject":
	default:
		return c, fmt.Errorf("llm_route config: state: on_state_error must be local or reject, not %q", c.OnStateError)
	}
	if c.DB < 0 {
		return c, fmt.Errorf("llm_route config: state: db must not be negative")
	}
	if c.Address == "" {
		c.Address = defaultStateAddress
	}
	if c.Prefix == "" {
		c.Prefix = defaultStatePrefix
	}
	if c.OnStateError == "" {
		c.OnStateError = "local"
	}
	t := durationOr(defaultStateTimeout, c.Timeout)
	ttl := durationOr(defaultLeaseTTL, c.LeaseTTL)
	if t <= 0 || ttl <= 0 {
		return c, fmt.Errorf("llm_route config: state: timeout and lease_ttl must be positive")
	}
	c.Timeout, c.LeaseTTL = new(Duration(t)), new(Duration(ttl))
	c.Username = resolveSecret(repl, c.Username)
	c.Password = resolveSecret(repl, c.Password)
	return c, nil
}

// provisionState checks the state config and makes the handler's ledger:
// memory, or for redis one on the pooled fleet of the state block, made
// with its client on first use (no connection yet: Redis down at start-up
// must not stop Caddy). The ledger wakes the scheduler through the hook it
// is given and never names it.
func (h *Handler) provisionState(repl *caddy.Replacer) error {
	h.led = ledger.NewMemory(sched.dispatch)
	if h.State == nil {
		return nil
	}
	c, err := h.State.resolved(repl)
	if err != nil {
		return err
	}
	if c.Backend == "redis" {
		h.led = ledger.NewRedis(ledger.RedisOptions{
			Options: redisstate.Options{
				Address: c.Address, Username: c.Username, Password: c.Password, DB: c.DB, TLS: c.TLS,
				Prefix: c.Prefix, Timeout: time.Duration(*c.Timeout), LeaseTTL: time.Duration(*c.LeaseTTL),
			},
			Reject: c.OnStateError == "reject",
		}, h.logger, sched.dispatch)
	}
	return nil
}

// releaseState takes the handler's scopes out of its fleet and gives the
// fleet back to the pool (Cleanup).
func (h *Handler) releaseState() {
	if h.led != nil {
		h.led.Close()
	}
}

// startState starts the handler's ledger once its config runs: a redis
// fleet takes on the handler's upstreams, providers and backoff scopes and
// starts its renewals and listener (once, if an older config on the same
// state block has not). Other handlers, in this config or another, keep
// their own ledgers: a fleet that no handler uses any more is switched off
// when the last of them is cleaned up (its leases expire within lease_ttl).
func (h *Handler) startState() {
	ups := make([]*ledger.Upstream, 0, len(h.table.upstreams))
	for _, u := range h.table.upstreams {
		ups = append(ups, &u.Upstream)
	}
	h.led.Start(h.logger, ups)
}
