package llmroute

import (
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// sessions is the process-wide session registry of SPEC §5: LRU of 1000
// sessions, 6 h TTL. It is package-level so that a config reload keeps every
// conversation's id.
var sessions = transform.NewSessions(1000, 6*time.Hour, time.Now)
