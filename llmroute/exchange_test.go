package llmroute

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	dto "github.com/prometheus/client_model/go"
)

func TestAttemptOutcome(t *testing.T) {
	for _, tc := range []struct {
		name       string
		clientGone bool
		fired      string
		ctxErr     error
		want       attemptResult
	}{
		{"client left", true, "", context.Canceled, attemptResult{out: outDone, result: resultCancelled}},
		{"client left while the timer fired", true, codeFirstByte, context.Canceled, attemptResult{out: outDone, result: resultCancelled}},
		{"first byte timeout", false, codeFirstByte, context.Canceled, attemptResult{out: outFailover, result: resultTimeout}},
		{"request_timeout", false, "", context.DeadlineExceeded, attemptResult{out: outFailover, result: resultTimeout}},
		{"drain window", false, codeDrain, context.Canceled, attemptResult{out: outFailover, result: resultNetErr}},
		{"connection refused", false, "", nil, attemptResult{out: outFailover, result: resultNetErr}},
	} {
		if got := attemptOutcome(tc.clientGone, tc.fired, tc.ctxErr); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestStreamVerdict(t *testing.T) {
	type in struct {
		done, clientWrite, clientGone bool
		fired                         string
		ctxErr                        error
	}
	for _, tc := range []struct {
		name string
		in   in
		want *streamErr // nil = ok
	}{
		{"[DONE] out, then the client closed", in{done: true, clientGone: true, ctxErr: context.Canceled}, nil},
		{"[DONE] out, then the upstream reset", in{done: true}, nil},
		{"[DONE] out, then request_timeout", in{done: true, ctxErr: context.DeadlineExceeded}, nil},
		{"client stopped reading", in{clientWrite: true}, &streamErr{result: resultCancelled}},
		{"client stopped reading past request_timeout", in{clientWrite: true, ctxErr: context.DeadlineExceeded}, &streamErr{result: resultCancelled}},
		{"client left mid-stream", in{clientGone: true, ctxErr: context.Canceled}, &streamErr{result: resultCancelled}},
		{"stall", in{fired: codeStalled, ctxErr: context.Canceled}, &streamErr{result: resultTimeout, code: codeStalled, fault: true}},
		{"request_timeout: not the upstream's fault", in{ctxErr: context.DeadlineExceeded}, &streamErr{result: resultTimeout, code: codeRequestTimeout}},
		{"reset", in{}, &streamErr{result: resultNetErr, code: codeInterrupted, fault: true}},
	} {
		got := streamVerdict(tc.in.done, tc.in.clientWrite, tc.in.clientGone, tc.in.fired, tc.in.ctxErr)
		switch {
		case got == nil && tc.want == nil:
		case got == nil || tc.want == nil || *got != *tc.want:
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestDecideFirstRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		err     error
		readWon bool
		want    firstRead
	}{
		{"data won", 10, nil, true, firstProceed},
		{"data and EOF", 10, io.EOF, true, firstProceed},
		{"empty stream", 0, io.EOF, true, firstProceed},
		{"timer fired just after the data", 10, nil, false, firstTimedOut},
		{"timer fired, read cancelled", 0, context.Canceled, false, firstTimedOut},
		{"reset before a byte", 0, errors.New("connection reset"), true, firstFailed},
	} {
		if got := decideFirstRead(tc.n, tc.err, tc.readWon); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWatchdogHold: hold decides the race between a read and the timer
// once; the side that lost does nothing. The timer records why it fired
// before it cancels (a read that fails on the cancel must find the
// reason), so the waits below poll for both.
func TestWatchdogHold(t *testing.T) {
	t.Run("timer fired after the read returned", func(t *testing.T) {
		var cancelled atomic.Bool
		w := &watchdog{cancel: func() { cancelled.Store(true) }}
		w.arm(time.Millisecond, codeFirstByte)
		deadline := time.Now().Add(10 * time.Second)
		for (w.firedFor() == "" || !cancelled.Load()) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := w.hold(); got != codeFirstByte {
			t.Fatalf("hold = %q, want %q", got, codeFirstByte)
		}
		if !cancelled.Load() {
			t.Error("the timer won but did not cancel")
		}
		w.resume() // a fired watchdog stays fired
		if got := w.hold(); got != codeFirstByte {
			t.Errorf("hold after resume = %q", got)
		}
	})
	t.Run("read won", func(t *testing.T) {
		var cancelled atomic.Bool
		w := &watchdog{cancel: func() { cancelled.Store(true) }}
		w.prime(50*time.Millisecond, codeStalled)
		w.resume()
		if got := w.hold(); got != "" {
			t.Fatalf("hold = %q, want the read to win", got)
		}
		time.Sleep(150 * time.Millisecond) // past the window: a held timer never fires
		if cancelled.Load() || w.firedFor() != "" {
			t.Error("a held timer fired")
		}
		w.resume()
		deadline := time.Now().Add(10 * time.Second)
		for (w.firedFor() == "" || !cancelled.Load()) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if w.firedFor() != codeStalled || !cancelled.Load() {
			t.Errorf("resumed timer: fired %q cancelled %v", w.firedFor(), cancelled.Load())
		}
		w.stop()
	})
	t.Run("a shorter window after a long one fires on time", func(t *testing.T) {
		var cancelled atomic.Bool
		w := &watchdog{cancel: func() { cancelled.Store(true) }}
		w.arm(time.Hour, codeFirstByte) // its timer is due in an hour
		if w.hold() != "" {
			t.Fatal("the hour passed at once")
		}
		w.arm(20*time.Millisecond, codeDrain)
		deadline := time.Now().Add(10 * time.Second)
		for (w.firedFor() == "" || !cancelled.Load()) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if w.firedFor() != codeDrain || !cancelled.Load() {
			t.Errorf("the 20 ms window after an hour's: fired %q cancelled %v", w.firedFor(), cancelled.Load())
		}
	})
	t.Run("stop takes the timer away", func(t *testing.T) {
		w := &watchdog{cancel: func() { t.Error("a stopped watchdog cancelled") }}
		w.arm(time.Hour, codeFirstByte)
		w.stop()
		if w.armed.Load() {
			t.Error("a stopped watchdog still has its timer pending")
		}
	})
	t.Run("time held between reads never counts", func(t *testing.T) {
		w := &watchdog{cancel: func() { t.Error("cancelled for time the proxy spent writing") }}
		w.prime(200*time.Millisecond, codeStalled)
		for range 3 {
			w.resume() // an upstream read that returns at once
			if w.hold() != "" {
				t.Fatal("an instant read lost")
			}
			time.Sleep(300 * time.Millisecond) // a slow client write: held
		}
		w.stop()
	})
}

// TestNoteDone: the [DONE] event is seen at a line start, also when it is
// split over writes, and not inside content.
func TestNoteDone(t *testing.T) {
	ev := `data: {"choices":[{"delta":{"content":"say data: [DONE] now"}}]}` + "\n\n"
	for _, tc := range []struct {
		name   string
		writes []string
		want   bool
	}{
		{"one write", []string{ev + "data: [DONE]\n\n"}, true},
		{"alone", []string{ev, "data: [DONE]\n\n"}, true},
		{"first event", []string{"data: [DONE]\n\n"}, true},
		{"split in the marker", []string{ev + "data: [DO", "NE]\n\n"}, true},
		{"split before the marker", []string{ev[:len(ev)-1], "\ndata: [DONE]\n\n"}, true},
		{"byte by byte", strings.Split(ev+"data: [DONE]\n\n", ""), true},
		{"CR line ends", []string{"data: {}\r\rdata: [DONE]\r\r"}, true},
		{"inside content only", []string{ev}, false},
		{"inside content, split", strings.Split(ev, ""), false},
		{"no [DONE]", []string{"data: {}\n\n", "data: {}\n\n"}, false},
	} {
		var c clientWriter
		for _, w := range tc.writes {
			c.noteDone([]byte(w))
		}
		if c.done != tc.want {
			t.Errorf("%s: done = %v, want %v", tc.name, c.done, tc.want)
		}
	}
}

// newTwoUpstreamHandler provisions a Handler (bare Caddy context) whose
// model m tries first, then second.
func newTwoUpstreamHandler(t *testing.T, first, second string, firstByte string) *Handler {
	t.Helper()
	raw := `{
		"providers": [{"id": "p1", "url": "` + first + `/v1", "first_byte_timeout": "` + firstByte + `"},
			{"id": "p2", "url": "` + second + `/v1"}],
		"upstreams": [{"id": "race-u1", "provider": "p1", "model": "x"}, {"id": "race-u2", "provider": "p2", "model": "x"}],
		"models": [{"name": "m", "upstreams": ["race-u1", "race-u2"]}]
	}`
	h := new(Handler)
	if err := json.Unmarshal([]byte(raw), h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// TestFirstByteTimerFiresJustAfterData: the first-byte timer fires right
// after the first read returned data. The attempt is a first-byte timeout
// that fails over, never a cut stream on the client.
func TestFirstByteTimerFiresJustAfterData(t *testing.T) {
	stream := func(text string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"`+text+`"}}]}`+"\n\n")
			w.(http.Flusher).Flush()
			select { // the rest comes later
			case <-time.After(200 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		}
	}
	up1 := httptest.NewServer(stream("one"))
	defer up1.Close()
	up2 := httptest.NewServer(stream("two"))
	defer up2.Close()
	h := newTwoUpstreamHandler(t, up1.URL, up2.URL, "100ms")

	calls := 0
	testHookFirstRead = func(w8 *watchdog) {
		calls++
		if calls > 1 {
			return
		}
		// Hold the request goroutine until the timer has fired: data in
		// hand, the timer first.
		deadline := time.Now().Add(10 * time.Second)
		for w8.firedFor() == "" && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	defer func() { testHookFirstRead = nil }()

	timeouts := h.table.routes["m"].targets[0].counters[resultTimeout]
	netErrs := h.table.routes["m"].targets[0].counters[resultNetErr]
	beforeTimeout, beforeNetErr := counterValue(t, timeouts), counterValue(t, netErrs)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	rec := httptest.NewRecorder()
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("the handler aborted the response (%v): a cut stream", p)
			}
		}()
		if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil {
			t.Fatal(err)
		}
	}()
	body := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.Contains(body, `"two"`) || strings.Contains(body, `"one"`) ||
		!strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("want the second upstream's whole stream, got %d %q", rec.Code, body)
	}
	if d := counterValue(t, timeouts) - beforeTimeout; d != 1 {
		t.Errorf("timeout results on the first upstream: %v, want 1", d)
	}
	if d := counterValue(t, netErrs) - beforeNetErr; d != 0 {
		t.Errorf("net_err results on the first upstream: %v, want 0", d)
	}
	for _, id := range []string{"race-u1", "race-u2"} {
		if n := h.table.upstreams[id].State.Inflight(); n != 0 {
			t.Errorf("%s: inflight %d after the request", id, n)
		}
	}
}

// counterValue reads a counter.
func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestWatchdogPrimeAllocatesNothing: a window's reason is stored without an
// allocation (every streamed request primes two windows).
func TestWatchdogPrimeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	var w watchdog
	for _, reason := range []string{codeFirstByte, codeStalled, codeDrain} {
		if n := testing.AllocsPerRun(100, func() { w.prime(time.Second, reason) }); n != 0 {
			t.Errorf("prime(%q): %v allocations, want 0", reason, n)
		}
		if got := *w.reason.Load(); got != reason {
			t.Errorf("reason stored as %q, want %q", got, reason)
		}
	}
	w.prime(time.Second, "some other reason")
	if got := *w.reason.Load(); got != "some other reason" {
		t.Errorf("an unlisted reason stored as %q", got)
	}
}
