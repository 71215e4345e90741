package llmroute

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Duration is a length of time in the config. It reads like caddy.Duration
// (an integer is nanoseconds; a string is a Go/Caddy duration such as "30s",
// "1h15m" or "1d") and additionally accepts ISO-8601 durations as the original
// llm-proxy config used them: "PT30S", "PT1H15M", "PT0.5S", "PT500MS", "P1D",
// "P1W", "P1M" (30 days) and "P1Y" (365 days). It is written back to JSON as a
// Go duration string, so `caddy adapt` output is canonical.
type Duration time.Duration

// maxDurationText bounds the input like caddy.ParseDuration does.
const maxDurationText = 1024

// ParseDuration parses a Go/Caddy or ISO-8601 duration. Negative values are
// rejected: no setting of this module has a meaning for them.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New("empty duration")
	}
	if len(s) > maxDurationText {
		return 0, errors.New("duration too long")
	}
	var d time.Duration
	var err error
	if s[0] == 'P' || s[0] == 'p' {
		d, err = parseISO8601(s)
	} else {
		d, err = caddy.ParseDuration(s)
	}
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want e.g. 30s, 1h15m, 1d, PT30S or P1D", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("invalid duration %q: must not be negative", s)
	}
	return d, nil
}

// iso8601Unit is one designator of an ISO-8601 duration and its length.
type iso8601Unit struct {
	designator string
	length     time.Duration
	timePart   bool
}

// Units in the order ISO-8601 requires them. Years and months have no fixed
// length; like the original proxy we take 365 and 30 days.
var iso8601Units = []iso8601Unit{
	{"Y", 365 * 24 * time.Hour, false},
	{"M", 30 * 24 * time.Hour, false},
	{"W", 7 * 24 * time.Hour, false},
	{"D", 24 * time.Hour, false},
	{"H", time.Hour, true},
	{"M", time.Minute, true},
	{"MS", time.Millisecond, true}, // not ISO, but the original config documents PT500MS
	{"S", time.Second, true},
}

// parseISO8601 parses P[nY][nM][nW][nD][T[nH][nM][nS]] with decimal fractions
// allowed on every number (comma or dot).
func parseISO8601(s string) (time.Duration, error) {
	s = asciiUpper(s) // strings.ToUpper would also map some non-ASCII letters
	if len(s) < 2 || s[0] != 'P' {
		return 0, errors.New("missing P")
	}
	rest := s[1:]
	var total float64
	next := 0 // index into iso8601Units of the next allowed unit
	inTime, any := false, false
	for rest != "" {
		if rest[0] == 'T' {
			if inTime {
				return 0, errors.New("second T")
			}
			inTime = true
			rest = rest[1:]
			if rest == "" {
				return 0, errors.New("empty time part")
			}
			for next < len(iso8601Units) && !iso8601Units[next].timePart {
				next++
			}
			continue
		}
		n := 0
		for n < len(rest) && (rest[n] >= '0' && rest[n] <= '9' || rest[n] == '.' || rest[n] == ',') {
			n++
		}
		if n == 0 {
			return 0, fmt.Errorf("expected a number at %q", rest)
		}
		num, err := strconv.ParseFloat(strings.ReplaceAll(rest[:n], ",", "."), 64)
		if err != nil {
			return 0, err
		}
		rest = rest[n:]
		found := false
		for i := next; i < len(iso8601Units); i++ {
			u := iso8601Units[i]
			if u.timePart != inTime || !strings.HasPrefix(rest, u.designator) {
				continue
			}
			if u.designator == "M" && strings.HasPrefix(rest, "MS") {
				continue // PT500MS: let the MS unit take it
			}
			total += num * float64(u.length)
			rest = rest[len(u.designator):]
			next = i + 1
			found, any = true, true
			break
		}
		if !found {
			return 0, fmt.Errorf("unexpected unit at %q", rest)
		}
	}
	if !any {
		return 0, errors.New("no value")
	}
	if total >= math.MaxInt64 { // float64(MaxInt64) is 2^63, itself out of range

		return 0, errors.New("duration out of range")
	}
	return time.Duration(total), nil
}

// asciiUpper upper-cases ASCII letters only.
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// UnmarshalJSON accepts an integer (nanoseconds) or a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var ns int64
	if err := json.Unmarshal(b, &ns); err != nil {
		return fmt.Errorf("invalid duration %s: want a string such as \"30s\" or an integer of nanoseconds", b)
	}
	if ns < 0 {
		return fmt.Errorf("invalid duration %d: must not be negative", ns)
	}
	*d = Duration(ns)
	return nil
}

// MarshalJSON writes the duration as a compact Go duration string ("30s",
// "720h", "1m30s", "500ms").
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

// String formats the duration compactly, dropping zero units.
func (d Duration) String() string {
	v := time.Duration(d)
	if v == 0 {
		return "0s"
	}
	if v%time.Second != 0 {
		return v.String()
	}
	s := v.String() // e.g. 720h0m0s, 1m30s
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// durationOr resolves an optional duration setting: the first non-nil value
// wins, else def.
func durationOr(def time.Duration, vals ...*Duration) time.Duration {
	for _, v := range vals {
		if v != nil {
			return time.Duration(*v)
		}
	}
	return def
}
