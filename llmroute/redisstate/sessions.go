package redisstate

import (
	"context"
	_ "embed"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed sessions.lua
	sessionsLua    string
	sessionsScript = redis.NewScript(sessionsLua)
)

// SessionKeyPrefix starts the keys of the session registry: one key per
// prefix hash of a conversation, holding its session id.
func (s *Store) SessionKeyPrefix() string { return s.prefix + "sess:" }

// Session returns the session id of a request whose prefix keys (under
// SessionKeyPrefix, longest first) are keys: the id of the longest one
// known, else candidate. It records every key under that id for ttl (at
// least a second), in the same round trip.
func (s *Store) Session(ctx context.Context, keys []string, candidate string, ttl time.Duration) (string, error) {
	if len(keys) == 0 {
		return candidate, nil
	}
	id, err := s.run(ctx, sessionsScript, keys, candidate, strconv.FormatInt(max(int64(ttl/time.Second), 1), 10)).Text()
	if err != nil {
		return "", err
	}
	if id == "" {
		return "", errors.New("redis: empty answer to the session script")
	}
	return id, nil
}
