package llmroute

import (
	"crypto/rand"
	"encoding/hex"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Response headers that say how a request was routed (route_headers).
const (
	hdrUpstream = "X-Llm-Route-Upstream"
	hdrAttempts = "X-Llm-Route-Attempts"
	hdrSkipped  = "X-Llm-Route-Skipped"
	hdrReqID    = "X-Request-Id"
)

// setRequestID gives the response the client's x-request-id, or a new one,
// so that an answer the proxy makes itself can be matched to its log entry.
// An upstream's own x-request-id replaces it when the upstream answers
// (writeResponseHeader copies the upstream's headers over).
func setRequestID(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(hdrReqID)
	if id == "" || len(id) > 200 {
		var b [12]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
	}
	w.Header()[hdrReqID] = []string{id}
}

// setRouteHeaders names the upstream about to answer and the attempt number.
// Set before each attempt, so a failover overwrites the previous one's.
func (h *Handler) setRouteHeaders(w http.ResponseWriter, t *target, attempts int) {
	if !h.routeHeaders {
		return
	}
	hdr := w.Header()
	hdr[hdrUpstream] = []string{t.up.id}
	hdr[hdrAttempts] = []string{strconv.Itoa(attempts)}
}

// setSkipped is for the proxy's own 503: no upstream answered, and
// X-LLM-Route-Skipped says why each was passed over, in route order:
// `gpu=busy 1/1, cloud=cooling 4s, b=5xx 502`.
func (h *Handler) setSkipped(w http.ResponseWriter, rt *route, failures []attemptRecord) {
	if !h.routeHeaders {
		return
	}
	hdr := w.Header()
	delete(hdr, hdrUpstream)
	hdr[hdrAttempts] = []string{strconv.Itoa(len(failures))}
	hdr[hdrSkipped] = []string{skippedList(rt, failures, time.Now())}
}

// skippedList renders why each upstream of rt did not answer: the failed
// attempt's result (and status), else cooling time left, else busy slots.
func skippedList(rt *route, failures []attemptRecord, now time.Time) string {
	var b strings.Builder
	for i, t := range rt.targets {
		if i > 0 {
			b.WriteString(", ")
		}
		u := t.up
		b.WriteString(u.id)
		b.WriteByte('=')
		if f, ok := failedAttempt(failures, u.id); ok {
			b.WriteString(f.result)
			if f.status != 0 {
				b.WriteByte(' ')
				b.WriteString(strconv.Itoa(f.status))
			}
			continue
		}
		if left := u.cooling(now); left > 0 {
			b.WriteString("cooling ")
			b.WriteString(strconv.Itoa(int(math.Ceil(left.Seconds()))))
			b.WriteByte('s')
			continue
		}
		b.WriteString("busy ")
		b.WriteString(strconv.FormatInt(u.state.inflight.Load(), 10))
		b.WriteByte('/')
		if u.limit == unlimited {
			b.WriteString("unlimited")
		} else {
			b.WriteString(strconv.FormatInt(u.limit, 10))
		}
	}
	return b.String()
}

func failedAttempt(failures []attemptRecord, id string) (attemptRecord, bool) {
	for i := len(failures) - 1; i >= 0; i-- {
		if failures[i].upstream == id {
			return failures[i], true
		}
	}
	return attemptRecord{}, false
}
