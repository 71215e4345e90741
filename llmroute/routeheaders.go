package llmroute

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// Response headers the proxy adds (route_headers).
const (
	hdrRouteUpstream = "X-Llm-Route-Upstream"
	hdrRouteAttempts = "X-Llm-Route-Attempts"
	hdrRouteSkipped  = "X-Llm-Route-Skipped"
	// hdrRoutePlacement is a pool member's placement (place.go).
	hdrRoutePlacement = "X-Llm-Route-Placement"
	// hdrRouteRule and hdrRouteEffort are a router model's rule and the
	// request's effort with its source, "high (suffix)" (rules.go).
	hdrRouteRule   = "X-Llm-Route-Rule"
	hdrRouteEffort = "X-Llm-Route-Effort"
	hdrRequestID   = "X-Request-Id"
)

// maxClientRequestID bounds an x-request-id taken from the client: a longer
// or non-printable one is replaced, so a client cannot make the proxy echo
// arbitrary bytes into its answers.
const maxClientRequestID = 128

// setRequestID puts an x-request-id on the answer before anything is
// written: the client's own if it sent a sane one, else a new random one. An
// upstream that sends its own x-request-id replaces it (headers.go copies
// upstream headers over these), so only proxy-made answers are sure to carry
// the proxy's.
func setRequestID(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(hdrRequestID)
	if !saneRequestID(id) {
		id = newRequestID()
	}
	w.Header().Set(hdrRequestID, id)
}

func saneRequestID(id string) bool {
	if id == "" || len(id) > maxClientRequestID {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// newRequestID returns 16 random bytes in hex, prefixed like the proxy's
// other identifiers so a log reader can tell who made it.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return "llmr-" + hex.EncodeToString(b[:])
}

// setRouteHeaders names the upstream about to answer and the attempt count;
// set before each attempt, so a failover overwrites them.
func (h *Handler) setRouteHeaders(w http.ResponseWriter, t *target, attempts int) {
	if !h.routeHeaders {
		return
	}
	// Both values in one allocation, each slice capped at its element. Not
	// shared across requests: Caddy's header handler may replace response
	// header values in place.
	vals := new([2]string)
	vals[0], vals[1] = t.up.ID, strconv.Itoa(attempts)
	hdr := w.Header()
	hdr[hdrRouteUpstream] = vals[0:1:1]
	hdr[hdrRouteAttempts] = vals[1:2:2]
}

// setSkipped prepares a proxy-made 503: no upstream answered, so the
// upstream header goes, and X-LLM-Route-Skipped says why each upstream of
// the model was passed over, in order, e.g. `gpu=busy 1/1, cloud=cooling 4s`.
// failures are the attempts this request made (they are named by their
// result, which says more than the cooling they may have started).
func (h *Handler) setSkipped(w http.ResponseWriter, rt *route, failures []attemptRecord, now time.Time) {
	if !h.routeHeaders {
		return
	}
	hdr := w.Header()
	delete(hdr, hdrRouteUpstream)
	if len(failures) == 0 {
		delete(hdr, hdrRouteAttempts)
	}
	hdr.Set(hdrRouteSkipped, skippedReasons(rt, failures, now))
}

// skippedReasons renders the reason each upstream of rt was not used. When
// rt is a size variant (context.go) or a key's budget variant (budget.go),
// the upstreams of the whole route are listed, those whose context_window
// the request does not fit, or whose worst case the budget has no room
// for, included.
func skippedReasons(rt *route, failures []attemptRecord, now time.Time) string {
	all := rt.targets
	if rt.budgetOf != nil {
		all = rt.budgetOf.targets
	}
	if rt.sizes.of != nil {
		all = rt.sizes.of.targets
	}
	var b strings.Builder
	for i := range all {
		u := all[i].up
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(u.ID)
		b.WriteByte('=')
		t, left := targetOf(rt, u), u.Cooling(now)
		fleet := u.led.FleetFull(&u.Upstream) // FleetFree unless Redis answers: the local counts are the truth then
		switch f, failed := failureOf(failures, u.ID); {
		case t == nil && rt.budgetOf != nil && targetOf(rt.budgetOf, u) != nil:
			b.WriteString("budget") // the key's budget has no room for its worst case
		case t == nil:
			b.WriteString("context_window ")
			b.WriteString(strconv.Itoa(u.window))
		case failed:
			b.WriteString("failed ")
			b.WriteString(f.result)
			if f.status != 0 {
				b.WriteByte(' ')
				b.WriteString(strconv.Itoa(f.status))
			}
		case left > 0:
			b.WriteString("cooling ")
			b.WriteString(strconv.Itoa(int((left + time.Second - 1) / time.Second)))
			b.WriteByte('s')
		case t.long.Full():
			// The same order as claimFrom: long slot, then the normal one.
			b.WriteString("long_context ")
			writeSlots(&b, t.long.Inflight(), t.long.Limit())
		case u.State.Inflight() < u.Limit && (u.ProviderFull() || fleet == ledger.FleetProviderFull && u.Prov != nil):
			b.WriteString("provider_capacity ")
			writeSlots(&b, u.Prov.Inflight(), u.Prov.Capacity())
			writeFleetFull(&b, fleet == ledger.FleetProviderFull && !u.ProviderFull())
		default:
			b.WriteString("busy ")
			writeSlots(&b, u.State.Inflight(), u.Limit)
			writeFleetFull(&b, fleet == ledger.FleetUpstreamFull && u.State.Inflight() < u.Limit)
		}
	}
	return b.String()
}

// writeFleetFull marks a limit that the shared state found full across the
// fleet at the last claim that reached it, though this instance's own
// counts (the ones written) have room.
func writeFleetFull(b *strings.Builder, full bool) {
	if full {
		b.WriteString(" fleet_full")
	}
}

// writeSlots writes `inflight/limit`, or just inflight without a limit.
func writeSlots(b *strings.Builder, inflight, limit int64) {
	b.WriteString(strconv.FormatInt(inflight, 10))
	if limit != ledger.Unlimited {
		b.WriteByte('/')
		b.WriteString(strconv.FormatInt(limit, 10))
	}
}

// targetOf is u's target in rt, nil when rt leaves u out.
func targetOf(rt *route, u *upstream) *target {
	for i := range rt.targets {
		if rt.targets[i].up == u {
			return &rt.targets[i]
		}
	}
	return nil
}

func failureOf(failures []attemptRecord, id string) (attemptRecord, bool) {
	for i := len(failures) - 1; i >= 0; i-- {
		if failures[i].upstream == id {
			return failures[i], true
		}
	}
	return attemptRecord{}, false
}
