package ledger

import (
	"context"
	"sync"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
)

// fleetKeys is the key store of a handler on the redis state:
// rates and budgets live in Redis, one script a call, each call
// bounded by the state timeout. While Redis is unreachable, or when a call
// fails, on_state_error decides: local answers from this process's memory
// store (the same limits, counted here only; the error is counted), reject
// refuses. The memory store is the one the handler would use anyway, so the
// fallback needs no warm-up and a key's accounts exist there already; every
// settlement Redis takes is added to it too, so a fallback starts from what
// this instance used (not from nothing; the other instances' use it cannot
// know).
type fleetKeys struct {
	f     *fleet
	local *keys.Memory
}

var _ keys.Store = (*fleetKeys)(nil)

// localKeys is this process's key store: the memory ledger's, and the
// fallback and local mirror of the redis ones. It is process-wide so that
// a reload keeps every key's accounts (keys.Memory counts the configs
// that hold each).
var localKeys = keys.NewMemory()

// LocalKeys returns this process's key store, for what only it does:
// holding the accounts of a config's keys (Acquire, Release) and saving
// and restoring their usage.
func LocalKeys() *keys.Memory { return localKeys }

// begin holds the fleet's client open for one key request, from its
// admission to its end (the returned func, nil when the client is closed
// already): a request of an old config that is still queued, or between
// failover attempts, when a reload that changed the state block cleans
// its handler up, reserves and settles in Redis all the same, instead of
// falling back to this instance's counters.
func (s *fleetKeys) begin() func() {
	if !s.f.use() {
		return nil
	}
	return s.f.done
}

// Allow implements keys.Store. Under reject a request is let through here:
// its budget reservation or its slot claim, which cannot succeed while
// Redis is away, refuses it with the 503 of the fallback rather than a 429
// that would blame the key.
func (s *fleetKeys) Allow(id string, now time.Time, r keys.Rate) (bool, time.Duration) {
	if r.PerMinute <= 0 {
		return true, 0
	}
	if s.f.healthy.Load() && s.f.use() {
		ok, wait, err := s.f.store.KeyAllow(context.Background(), id, r)
		s.f.done()
		if err == nil {
			return ok, wait
		}
		s.f.failed(err)
	}
	if s.f.reject {
		return true, 0
	}
	return s.local.Allow(id, now, r)
}

// Reserve implements keys.Store; a hold taken in Redis is marked Shared so
// that it is settled there, and it keeps the fleet's client open until
// then: a reload may clean the handler up while the request runs.
func (s *fleetKeys) Reserve(id string, now time.Time, b keys.Budget, a keys.Amount) (keys.Hold, keys.Limit) {
	if b.Empty() {
		return keys.Hold{}, keys.LimitNone
	}
	if s.f.healthy.Load() && s.f.use() {
		h, limit, err := s.f.store.KeyReserve(context.Background(), id, now, b, a)
		if !h.Shared {
			s.f.done()
		}
		if err == nil {
			return h, limit
		}
		s.f.failed(err)
	}
	if s.f.reject {
		return keys.Hold{}, keys.LimitUnavailable
	}
	return s.local.Reserve(id, now, b, a)
}

// Room implements keys.Store, with Reserve's fallback.
func (s *fleetKeys) Room(id string, now time.Time, b keys.Budget, a keys.Amount) keys.Limit {
	if b.Empty() {
		return keys.LimitNone
	}
	if s.f.healthy.Load() && s.f.use() {
		limit, err := s.f.store.KeyRoom(context.Background(), id, now, b, a)
		s.f.done()
		if err == nil {
			return limit
		}
		s.f.failed(err)
	}
	if s.f.reject {
		return keys.LimitUnavailable
	}
	return s.local.Room(id, now, b, a)
}

// Settle implements keys.Store. A shared hold is settled in Redis even
// while it is thought unreachable (one bounded call, and only for the
// requests that were running when it went away): settling it locally
// would subtract a reservation memory never had. If Redis does not take
// it, the error is counted, the reservation lapses with its lease
// (lease_ttl, no longer renewed) and the settlement is sent again with each
// renewal until Redis takes it (the script adds the use whether the lease
// is still there or not), so a request's real cost is never lost; the
// client stays open for it meanwhile. Redis records each reservation it
// settled, so a settlement it applied but whose reply was lost is not
// charged again when it is sent again. Settling gives back the hold on the
// client that Reserve took.
func (s *fleetKeys) Settle(h keys.Hold, actual keys.Amount, now time.Time) {
	if !h.Shared {
		s.local.Settle(h, actual, now)
		return
	}
	s.local.Record(h.ID, actual, now) // the local mirror: use only
	s.settleShared(h, actual, now)
}

// settleShared sends the settlement of a shared hold, whose client hold
// it gives back, or keeps for the retry when Redis does not take it.
func (s *fleetKeys) settleShared(h keys.Hold, actual keys.Amount, now time.Time) {
	if err := s.f.store.KeySettle(context.Background(), h, actual, now); err != nil {
		s.f.failed(err)
		s.f.settleLater.add(s.f, pendingSettle{h, actual, now}) // keeps the client hold
		return
	}
	s.f.done()
}

// Record implements keys.Store: the use of a key without a budget is
// added in Redis as well (a hold that reserved nothing, settled once like
// a reservation), so that every instance's status shows the fleet's use.
// While Redis is away it is counted here only, as a fallback reservation's
// use is.
func (s *fleetKeys) Record(id string, actual keys.Amount, now time.Time) {
	s.local.Record(id, actual, now)
	if actual == (keys.Amount{}) || !s.f.healthy.Load() || !s.f.use() {
		return
	}
	s.settleShared(s.f.store.UseHold(id, now), actual, now)
}

// maxPendingSettles bounds the settlements kept for a Redis that does not
// come back (each about 100 bytes).
const maxPendingSettles = 100_000

type pendingSettle struct {
	h      keys.Hold
	actual keys.Amount
	at     time.Time
}

// pendingSettles are key settlements Redis did not take; each keeps its
// hold on the fleet's client until it is sent.
type pendingSettles struct {
	mu   sync.Mutex
	list []pendingSettle
}

func (p *pendingSettles) add(f *fleet, ps pendingSettle) {
	p.mu.Lock()
	p.list = append(p.list, ps)
	dropped := len(p.list) > maxPendingSettles
	if dropped { // the oldest is given up
		p.list = p.list[1:]
	}
	p.mu.Unlock()
	if dropped {
		f.done()
	}
}

// retry sends the pending settlements again, in order, and keeps those
// Redis still does not take.
func (p *pendingSettles) retry(ctx context.Context, f *fleet) error {
	p.mu.Lock()
	list := p.list
	p.list = nil
	p.mu.Unlock()
	for i, ps := range list {
		if err := f.store.KeySettle(ctx, ps.h, ps.actual, ps.at); err != nil {
			p.mu.Lock()
			p.list = append(list[i:len(list):len(list)], p.list...)
			p.mu.Unlock()
			return err
		}
		f.done()
	}
	return nil
}

// Usage implements keys.Store: the fleet-wide accounting, else this
// process's.
func (s *fleetKeys) Usage(id string, now time.Time) keys.Usage {
	if s.f.healthy.Load() && s.f.use() {
		u, err := s.f.store.KeyUsage(context.Background(), id, now)
		s.f.done()
		if err == nil {
			return u
		}
		s.f.failed(err)
	}
	return s.local.Usage(id, now)
}
