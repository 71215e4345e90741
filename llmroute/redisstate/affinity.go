package redisstate

import (
	"context"
	_ "embed"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed affinity.lua
	affinityLua    string
	affinityScript = redis.NewScript(affinityLua)
)

// affinityKey is the key of pool's pin of an affinity key's hash.
func (s *Store) affinityKey(pool string, key uint64) []string {
	return []string{s.prefix + "aff:" + pool + ":" + strconv.FormatUint(key, 16)}
}

// Affinity returns the member (an upstream id) that served the affinity
// key's hash last in pool, "" when none is recorded.
func (s *Store) Affinity(ctx context.Context, pool string, key uint64) (string, error) {
	return s.run(ctx, affinityScript, s.affinityKey(pool, key), "", "0").Text()
}

// SetAffinity records member as the one that served the key last, for ttl
// (at least a millisecond); member "" forgets the pin.
func (s *Store) SetAffinity(ctx context.Context, pool string, key uint64, member string, ttl time.Duration) error {
	if member == "" {
		member = "-"
	}
	return s.run(ctx, affinityScript, s.affinityKey(pool, key), member, strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)).Err()
}
