package llmroute

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// Under state memory the keys' usage lives in this process, so a restart
// would give every budget back. It is therefore kept in Caddy's configured
// storage (the file system by default, as for certificates): one JSON
// document of every key's settled use in its current UTC day and month,
// written every keyUsageEvery while something was settled, and when a
// handler is cleaned up (a reload or the shutdown) if something was since
// the last write; read when a handler
// creates a key's account. Only an account created then is given its saved
// use: one a running config holds counts on, so a reload neither loads a
// use twice nor takes back what was used since the last write. A use of a
// past day or month is not brought back (keys.Memory.Restore). Under state
// redis the usage lives in Redis, whose own persistence keeps it.

// keyUsageKey is where the document is kept in the storage.
const keyUsageKey = "llm_route/key_usage.json"

// keyUsageEvery is how often the usage is written while it changes: what
// a crash (not a shutdown) can lose. A variable for the tests.
var keyUsageEvery = 30 * time.Second

// keyUsageTimeout bounds one read or write of the storage.
const keyUsageTimeout = 10 * time.Second

// usageDoc is the document: no secret, only ids and amounts.
type usageDoc struct {
	Saved time.Time             `json:"saved"`
	Keys  map[string]usageEntry `json:"keys"`
}

// usageEntry is one key's use; spend in nano-USD (billionths of a dollar),
// so that it comes back exactly.
type usageEntry struct {
	Day            string `json:"day"`   // UTC, 2006-01-02
	Month          string `json:"month"` // UTC, 2006-01
	TokensToday    int64  `json:"tokens_today"`
	SpendTodayNano int64  `json:"spend_today_nano_usd"`
	SpendMonthNano int64  `json:"spend_month_nano_usd"`
}

// usageStorage is what of certmagic.Storage the usage needs.
type usageStorage interface {
	Store(ctx context.Context, key string, value []byte) error
	Load(ctx context.Context, key string) ([]byte, error)
}

// storageOf is the config's storage, or nil for a context that belongs to
// no config (a handler provisioned outside a Caddy config, as benchmarks
// do), where there is nothing to persist to.
func storageOf(ctx caddy.Context) (s usageStorage) {
	defer func() {
		if recover() != nil { // caddy.Context.Storage dereferences the config
			s = nil
		}
	}()
	if st := ctx.Storage(); st != nil {
		return st
	}
	return nil
}

// usageSaver writes the process's key usage; one per process, as the
// key store is.
var usageSaver saver

type saver struct {
	mu      sync.Mutex // one write at a time: an older snapshot never lands last
	written uint64     // ledger.LocalKeys().Changes() at the last write
	to      usageStorage
	logger  *zap.Logger
	users   int // handlers persisting; the ticker runs while > 0
	stop    chan struct{}
	done    chan struct{}
}

// restoreKeyUsage gives the accounts this handler created (ids) the use
// saved in its storage, and makes it a user of the saver.
func (h *Handler) restoreKeyUsage(st usageStorage, created []string) {
	h.usageStorage = st
	if len(created) > 0 {
		if doc, err := loadUsage(st); err != nil {
			h.logger.Error("reading the saved key usage; the keys start from nothing", zap.String("storage_key", keyUsageKey), zap.Error(err))
		} else {
			now := time.Now()
			for _, id := range created {
				if e, ok := doc.Keys[id]; ok {
					ledger.LocalKeys().Restore(id, e.saved(), now)
				}
			}
		}
	}
	usageSaver.attach(st, h.logger)
}

// saveKeyUsage writes the usage to the handler's storage and leaves the
// saver (a handler being cleaned up).
func (h *Handler) saveKeyUsage() {
	if h.usageStorage == nil {
		return
	}
	usageSaver.detach(h.usageStorage)
	h.usageStorage = nil
}

func loadUsage(st usageStorage) (usageDoc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), keyUsageTimeout)
	defer cancel()
	b, err := st.Load(ctx, keyUsageKey)
	if errors.Is(err, fs.ErrNotExist) {
		return usageDoc{}, nil
	}
	if err != nil {
		return usageDoc{}, err
	}
	var doc usageDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return usageDoc{}, err
	}
	return doc, nil
}

// saved converts an entry; a malformed period is one that never matches.
func (e usageEntry) saved() keys.Saved {
	s := keys.Saved{Day: -1, Month: -1, TokensToday: e.TokensToday, SpendToday: e.SpendTodayNano, SpendMonth: e.SpendMonthNano}
	if t, err := time.Parse(time.DateOnly, e.Day); err == nil {
		s.Day = keys.Day(t)
	}
	if t, err := time.Parse("2006-01", e.Month); err == nil {
		s.Month = keys.Month(t)
	}
	return s
}

// attach makes st the storage of the periodic writes (the newest config's)
// and starts them with the first user.
func (s *saver) attach(st usageStorage, logger *zap.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.to, s.logger = st, logger
	s.users++
	if s.users == 1 {
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.run(s.stop, s.done)
	}
}

// detach writes the usage to st, when something was used since the last
// write (so that `caddy validate`, which provisions and cleans up, writes
// nothing), and stops the periodic writes with the last user.
func (s *saver) detach(st usageStorage) {
	s.mu.Lock()
	s.writeLocked(st)
	s.users--
	var stop, done chan struct{}
	if s.users == 0 {
		stop, done = s.stop, s.done
		s.to, s.stop, s.done = nil, nil, nil
	}
	s.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

func (s *saver) run(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(keyUsageEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.mu.Lock()
			if s.to != nil {
				s.writeLocked(s.to)
			}
			s.mu.Unlock()
		}
	}
}

// writeLocked writes the usage to st when something was settled since the
// last write. s.mu held.
func (s *saver) writeLocked(st usageStorage) {
	if ledger.LocalKeys().Changes() == s.written {
		return
	}
	now := time.Now()
	snap, n := ledger.LocalKeys().Snapshot(now)
	doc := usageDoc{Saved: now.UTC(), Keys: make(map[string]usageEntry, len(snap))}
	for id, u := range snap {
		doc.Keys[id] = usageEntry{
			Day:         time.Unix(u.Day*86400, 0).UTC().Format(time.DateOnly),
			Month:       time.Date(int(u.Month/12), time.Month(u.Month%12+1), 1, 0, 0, 0, 0, time.UTC).Format("2006-01"),
			TokensToday: u.TokensToday, SpendTodayNano: u.SpendToday, SpendMonthNano: u.SpendMonth,
		}
	}
	b, err := json.Marshal(doc)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), keyUsageTimeout)
		err = st.Store(ctx, keyUsageKey, b)
		cancel()
	}
	if err != nil {
		s.logger.Error("saving the key usage", zap.String("storage_key", keyUsageKey), zap.Error(err))
		return
	}
	s.written = n
}
