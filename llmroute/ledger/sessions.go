package ledger

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// sessionTTL is how long a conversation's id outlives its last turn.
const sessionTTL = 6 * time.Hour

// sessions is the process-wide session registry: LRU of 1000
// sessions, 6 h TTL. It is package-level so that a config reload keeps every
// conversation's id.
var sessions = &sessionRegistry{local: transform.NewSessions(1000, sessionTTL, time.Now)}

// sessionRegistry names sessions from this process's registry, or with the
// redis state from the one shared in Redis, so that a session id
// stays the same whichever instance serves the next turn. Only requests
// that compute a session header get here, so only they pay the round trip
// (one script call, bounded by the state timeout).
//
// The local registry records every id Redis chose, and answers alone when
// Redis cannot: while the fleet is unhealthy (no call at all) and when the
// call fails or times out. A failed call counts in
// llm_proxy_state_errors_total and is logged at ERROR once per transition,
// but it does not switch the instance's accounting to its fallback (the
// claims and renewals find an unreachable Redis themselves): a session id
// is never worth a 503, under on_state_error reject as well.
type sessionRegistry struct {
	local   *transform.Sessions
	failing atomic.Bool // the last shared call failed
}

// shared returns the session id of a final outgoing body from the
// registry in f's Redis, and records its history, as
// transform.Sessions.ID does (the redis ledger's SessionID; the memory
// ledger asks r.local alone).
func (r *sessionRegistry) shared(f *fleet, body []byte) string {
	if !f.healthy.Load() || !f.use() {
		return r.local.ID(body)
	}
	defer f.done()
	h := transform.NewHistory(body)
	if h.Empty() {
		return h.Candidate
	}
	keys := h.Keys(make([]string, 0, 16), f.store.SessionKeyPrefix())
	id, err := f.store.Session(context.Background(), keys, h.Candidate, sessionTTL)
	if err == nil && !transform.ValidHeaderValue(id) {
		err = errors.New("redis: the session registry holds an id that is no header value")
	}
	if err != nil {
		stateErrors.Inc()
		if r.failing.CompareAndSwap(false, true) {
			f.logger.Load().Error("shared session registry unreachable, session ids from this instance's registry",
				zap.String("backend", "redis"), zap.String("address", f.address), zap.Error(err))
		}
		return r.local.Resolve(h)
	}
	if r.failing.CompareAndSwap(true, false) {
		f.logger.Load().Info("shared session registry reachable, using it", zap.String("backend", "redis"), zap.String("address", f.address))
	}
	r.local.Record(h, id)
	return id
}

// Sessions returns the number of sessions in this process's registry.
func Sessions() int { return sessions.local.Len() }
