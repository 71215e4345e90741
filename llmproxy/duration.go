package llmproxy

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llm-route/caddy-llm-route/llmroute"
)

// unitComponent is one part of the unit form Kotlin's Duration.parse
// also takes ("1h 30m", "500ms", "1.5d"), which the original config
// accepted besides ISO-8601.
var unitComponent = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(d|h|m|s|ms|us|ns)$`)

// parseDuration reads a duration of llm-proxy's config: ISO-8601 as the
// original documents it (PT30S, PT1H15M, PT0.5S, P1D, P1W, P1M = 30 days,
// P1Y = 365 days, and its PT500MS), or Kotlin's unit form ("30s",
// "1h 30m"). Negative durations have no meaning in the config and are
// refused.
func parseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	bad := fmt.Errorf("invalid ISO-8601 duration %q (e.g. PT30S, PT15M, P1D)", s)
	if t == "" {
		return 0, bad
	}
	if t[0] == 'P' || t[0] == 'p' {
		d, err := llmroute.ParseDuration(t)
		if err != nil {
			return 0, bad
		}
		return d, nil
	}
	fields := strings.Fields(t)
	for _, f := range fields {
		if !unitComponent.MatchString(f) {
			return 0, bad
		}
	}
	d, err := caddy.ParseDuration(strings.Join(fields, ""))
	if err != nil || d < 0 {
		return 0, bad
	}
	return d, nil
}
