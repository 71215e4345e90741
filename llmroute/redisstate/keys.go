package redisstate

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
)

// Client keys' accounting in Redis: the GCRA rate of a key is
// one string (its theoretical arrival time, on the server's clock), its
// budgets one hash per UTC day and one per month, which expire by
// themselves once their period is over. Each operation is one script. The
// periods are the caller's (keys.Day, keys.Month of its now), as the
// memory store's are: instances whose clocks disagree by a second only
// disagree about the second around midnight.
//
// A reservation is a lease (key_lease.lua): renewed by its Store every
// third of lease_ttl until it is settled, so that one whose settlement is
// lost (the instance died, Redis did not answer, the client was gone)
// leaves the budget within lease_ttl instead of staying reserved for the
// rest of the day.

var (
	//go:embed key_lease.lua
	keyLeaseLua string
	//go:embed key_allow.lua
	keyAllowLua string
	//go:embed key_reserve.lua
	keyReserveLua string
	//go:embed key_settle.lua
	keySettleLua string
	//go:embed key_usage.lua
	keyUsageLua string
	//go:embed key_renew.lua
	keyRenewLua string

	keyAllowScript   = redis.NewScript(keyAllowLua)
	keyReserveScript = redis.NewScript(keyLeaseLua + keyReserveLua)
	keySettleScript  = redis.NewScript(keySettleLua)
	keyUsageScript   = redis.NewScript(keyLeaseLua + keyUsageLua)
	keyRenewScript   = redis.NewScript(keyLeaseLua + keyRenewLua)
)

// Period hashes live a little longer than their period (a request settled
// just after midnight still finds yesterday's), then go.
const (
	dayTTL   = "172800"  // 2 days, in seconds
	monthTTL = "2764800" // 32 days
)

func (s *Store) keyRate(id string) string { return s.prefix + "key:" + id + ":rate" }

func (s *Store) keyPeriods(id string, day, month int64) []string {
	k := s.prefix + "key:" + id
	return []string{k + ":d:" + strconv.FormatInt(day, 10), k + ":m:" + strconv.FormatInt(month, 10)}
}

// keyAccounts are the keys of a key's scripts: its day and month hashes
// and its holds set.
func (s *Store) keyAccounts(id string, day, month int64) []string {
	return append(s.keyPeriods(id, day, month), s.prefix+"key:"+id+":holds")
}

// leases are the reservations a Store holds and renews until they settle.
type leases struct {
	mu   sync.Mutex
	held map[string]string // member → its key's holds set
	seq  atomic.Uint64
}

// KeyAllow is the GCRA check of one request of key id at rate r, on the
// server's clock.
func (s *Store) KeyAllow(ctx context.Context, id string, r keys.Rate) (bool, time.Duration, error) {
	if r.PerMinute <= 0 {
		return true, 0, nil
	}
	interval := int64(time.Minute/time.Microsecond) / r.PerMinute
	vals, err := s.run(ctx, keyAllowScript, []string{s.keyRate(id)}, interval, max(r.Burst, 1)).Int64Slice()
	if err != nil {
		return false, 0, err
	}
	if len(vals) != 2 {
		return false, 0, errors.New("redis: unexpected answer to the key rate script")
	}
	return vals[0] == 1, time.Duration(vals[1]) * time.Microsecond, nil
}

// KeyReserve reserves a on key id in the periods of now if its budget b
// leaves room, else names the first limit crossed (keys.Store.Reserve).
func (s *Store) KeyReserve(ctx context.Context, id string, now time.Time, b keys.Budget, a keys.Amount) (keys.Hold, keys.Limit, error) {
	if b.Empty() {
		return keys.Hold{}, keys.LimitNone, nil
	}
	a = keys.Amount{Tokens: max(a.Tokens, 0), Spend: max(a.Spend, 0)} // the lease's format has no sign
	day, month := keys.Day(now), keys.Month(now)
	accounts := s.keyAccounts(id, day, month)
	member := s.member(day, month, a)
	n, err := s.run(ctx, keyReserveScript, accounts,
		b.TokensPerDay, b.SpendPerDay, b.SpendPerMonth, a.Tokens, a.Spend, dayTTL, monthTTL,
		day, month, s.ttlMS, member).Int64()
	if err != nil {
		// A reservation the script took but whose answer was lost lapses
		// with its lease: it is not renewed.
		return keys.Hold{}, keys.LimitNone, err
	}
	if n != 0 {
		return keys.Hold{}, keys.Limit(n), nil
	}
	s.leases.mu.Lock()
	if s.leases.held == nil {
		s.leases.held = make(map[string]string)
	}
	s.leases.held[member] = accounts[2]
	s.leases.mu.Unlock()
	return keys.Hold{ID: id, Day: day, Month: month, Reserved: a, Shared: true, Lease: member}, keys.LimitNone, nil
}

// member names a new reservation of a in day and month:
// "<tag>.<number>:<day>:<month>:<tokens>:<spend>" (see key_lease.lua),
// unique among every Store's.
func (s *Store) member(day, month int64, a keys.Amount) string {
	return fmt.Sprintf("%s.%d:%d:%d:%d:%d", s.tag, s.leases.seq.Add(1), day, month, a.Tokens, a.Spend)
}

// UseHold is a hold that reserved nothing, for use to be added to key id
// (a key without a budget, whose usage is still shown): settling it adds
// the use, once however often it is sent, like a reservation's.
func (s *Store) UseHold(id string, now time.Time) keys.Hold {
	day, month := keys.Day(now), keys.Month(now)
	return keys.Hold{ID: id, Day: day, Month: month, Shared: true, Lease: s.member(day, month, keys.Amount{})}
}

// settledBlock is how many reservations of a Store share one settled
// bitmap: 8 KiB of Redis memory at most.
const settledBlock = 1 << 16

// settledBit names the bit that records a settlement of the reservation
// whose member is lease: in the settled bitmap of its Store (the one that
// reserved it, whichever settles it) and its number's block. ok is false
// for a member not in that form.
func (s *Store) settledBit(lease string) (key, bit string, ok bool) {
	head, _, _ := strings.Cut(lease, ":")
	dot := strings.LastIndexByte(head, '.')
	if dot < 0 {
		return "", "", false
	}
	n, err := strconv.ParseUint(head[dot+1:], 10, 64)
	if err != nil {
		return "", "", false
	}
	return s.prefix + "settled:" + head[:dot] + ":" + strconv.FormatUint(n/settledBlock, 10),
		strconv.FormatUint(n%settledBlock, 10), true
}

// KeyRoom is KeyReserve's check without the reservation (keys.Store.Room).
func (s *Store) KeyRoom(ctx context.Context, id string, now time.Time, b keys.Budget, a keys.Amount) (keys.Limit, error) {
	if b.Empty() {
		return keys.LimitNone, nil
	}
	a = keys.Amount{Tokens: max(a.Tokens, 0), Spend: max(a.Spend, 0)} // as KeyReserve counts it
	day, month := keys.Day(now), keys.Month(now)
	n, err := s.run(ctx, keyReserveScript, s.keyAccounts(id, day, month),
		b.TokensPerDay, b.SpendPerDay, b.SpendPerMonth, a.Tokens, a.Spend, dayTTL, monthTTL,
		day, month, s.ttlMS, "").Int64()
	if err != nil {
		return keys.LimitNone, err
	}
	return keys.Limit(n), nil
}

// KeySettle ends the reservation h, adding actual to the key's use in the
// periods of now (keys.Store.Settle). It is applied once per reservation:
// sending it again, after an error that left unknown whether Redis took
// it, charges nothing more.
func (s *Store) KeySettle(ctx context.Context, h keys.Hold, actual keys.Amount, now time.Time) error {
	if h.ID == "" {
		return nil
	}
	s.leases.mu.Lock()
	delete(s.leases.held, h.Lease) // settled or not, it is renewed no more
	s.leases.mu.Unlock()
	day, month := keys.Day(now), keys.Month(now)
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	// A settlement is recorded as applied, so that one sent again after
	// its reply was lost is not charged twice. The record is kept as long
	// as a day's accounting (two days after its block's last settlement).
	settled, bit, ok := s.settledBit(h.Lease)
	if !ok {
		settled, bit = s.prefix+"settled:none", ""
	}
	return s.run(ctx, keySettleScript, append(s.keyAccounts(h.ID, day, month), settled),
		flag(h.Day == day), flag(h.Month == month), -h.Reserved.Tokens, -h.Reserved.Spend,
		actual.Tokens, actual.Spend, dayTTL, monthTTL, h.Lease, bit).Err()
}

// RenewKeyLeases pushes on the leases of the reservations this Store holds.
func (s *Store) RenewKeyLeases(ctx context.Context) error {
	s.leases.mu.Lock()
	sets := make([]string, 0, len(s.leases.held))
	args := make([]any, 1, 1+len(s.leases.held))
	args[0] = s.ttlMS
	for member, set := range s.leases.held {
		sets = append(sets, set)
		args = append(args, member)
	}
	s.leases.mu.Unlock()
	if len(sets) == 0 {
		return nil
	}
	return s.run(ctx, keyRenewScript, sets, args...).Err()
}

// KeyLeases is the number of reservations this Store holds and renews.
func (s *Store) KeyLeases() int {
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	return len(s.leases.held)
}

// KeyUsage reads key id's accounting in the periods of now.
func (s *Store) KeyUsage(ctx context.Context, id string, now time.Time) (keys.Usage, error) {
	day, month := keys.Day(now), keys.Month(now)
	vals, err := s.run(ctx, keyUsageScript, s.keyAccounts(id, day, month), day, month).Int64Slice()
	if err != nil {
		return keys.Usage{}, err
	}
	if len(vals) != 5 {
		return keys.Usage{}, errors.New("redis: unexpected answer to the key usage script")
	}
	return keys.Usage{TokensToday: vals[0], SpendToday: vals[1], SpendMonth: vals[2],
		ReservedToken: vals[3], ReservedSpend: vals[4]}, nil
}
