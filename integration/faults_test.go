package integration

// Targeted fault tests (issue #6): for each way an upstream can break, what
// the client sees, the llm_proxy_requests_total result, and the backoff.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestFaultSilentUpstream: an upstream that never sends response headers.
func TestFaultSilentUpstream(t *testing.T) {
	silent := newUpstream(t, hang(nil))
	good := newUpstream(t, nil)
	conf := func(requestTimeout string) map[string]any {
		return cfg(
			[]map[string]any{
				obj("id", "f1-silent", "url", silent.base(), "first_byte_timeout", "300ms"),
				obj("id", "f1-good", "url", good.base()),
			},
			[]map[string]any{
				obj("id", "f1-silent-u", "provider", "f1-silent", "model", "s"),
				obj("id", "f1-good-u", "provider", "f1-good", "model", "g"),
			},
			[]map[string]any{
				obj("name", "f1-pair", "upstreams", []string{"f1-silent-u", "f1-good-u"}),
				obj("name", "f1-alone", "upstreams", []string{"f1-silent-u"}),
			},
			"request_timeout", requestTimeout)
	}
	p := startProxy(t, conf("2s"))

	t.Run("stream fails over after first_byte_timeout", func(t *testing.T) {
		p.load(conf("2s"))
		timeouts := p.requests("f1-pair", "f1-silent-u", "f1-silent", "timeout")
		oks := p.requests("f1-pair", "f1-good-u", "f1-good", "ok")
		start := time.Now()
		resp := p.chat(chatBody("f1-pair", true))
		body, err := faultRead(resp)
		elapsed := time.Since(start)
		if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("status %d err %v body %q", resp.StatusCode, err, body)
		}
		if elapsed < 300*time.Millisecond || elapsed >= 2*time.Second {
			t.Errorf("answered after %v; want within [first_byte_timeout 300ms, request_timeout 2s)", elapsed)
		}
		if d := p.requests("f1-pair", "f1-silent-u", "f1-silent", "timeout") - timeouts; d != 1 {
			t.Errorf("result timeout on the silent upstream counted %v times, want 1", d)
		}
		if d := p.requests("f1-pair", "f1-good-u", "f1-good", "ok") - oks; d != 1 {
			t.Errorf("result ok on the second upstream counted %v times, want 1", d)
		}
		if len(p.logEntries("first byte timeout, failing over")) == 0 {
			t.Error("no first-byte-timeout log entry")
		}
	})

	t.Run("non-stream bounded by request_timeout", func(t *testing.T) {
		p.load(conf("500ms"))
		timeouts := p.requests("f1-alone", "f1-silent-u", "f1-silent", "timeout")
		start := time.Now()
		resp := p.chat(chatBody("f1-alone", false))
		elapsed := time.Since(start)
		expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_failed")
		if elapsed < 500*time.Millisecond || elapsed > 3*time.Second {
			t.Errorf("answered after %v; want about request_timeout (500ms)", elapsed)
		}
		if d := p.requests("f1-alone", "f1-silent-u", "f1-silent", "timeout") - timeouts; d != 1 {
			t.Errorf("result timeout counted %v times, want 1", d)
		}
	})
	faultEventually(t, 30*time.Second, "inflight 0", func() bool {
		return p.upstreamGauge("inflight", "f1-silent-u", "f1-silent") == 0
	})
}

// TestFaultStreamStall: headers and two events, then silence.
func TestFaultStreamStall(t *testing.T) {
	events := faultEvents(2, "stall")
	up := newUpstream(t, faultStallAfter(events))
	p := startProxy(t, cfg(
		// probe_interval 0: the stalling upstream would pass a probe (2xx and a
		// first byte) and end the cooling this test looks at.
		[]map[string]any{obj("id", "f2-p", "url", up.base(), "stream_idle_timeout", "300ms", "backoff", "10s", "probe_interval", "0s")},
		[]map[string]any{obj("id", "f2-u", "provider", "f2-p", "model", "x")},
		[]map[string]any{obj("name", "f2", "upstreams", []string{"f2-u"})},
	))
	before := p.requests("f2", "f2-u", "f2-p", "timeout")
	start := time.Now()
	resp := p.chat(chatBody("f2", true))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	body, err := faultRead(resp)
	failedAt := time.Now()
	elapsed := failedAt.Sub(start)
	faultAbortedWith(t, body, err, strings.Join(events, ""), "stream_stalled")
	if elapsed < 300*time.Millisecond || elapsed > 3*time.Second {
		t.Errorf("stream cut after %v, want about stream_idle_timeout (300ms)", elapsed)
	}
	if d := p.requests("f2", "f2-u", "f2-p", "timeout") - before; d != 1 {
		t.Errorf("result timeout counted %v times, want 1", d)
	}
	if s := p.upstreamGauge("fail_streak", "f2-u", "f2-p"); s != 1 {
		t.Errorf("fail_streak = %v, want 1", s)
	}
	// (On a loaded machine the scrape may come after the 1s step ended.)
	if c := p.upstreamGauge("cooling_seconds", "f2-u", "f2-p"); c > 1 || c <= 0 && time.Since(failedAt) < 900*time.Millisecond {
		t.Errorf("cooling_seconds = %v, want the first backoff step (0, 1s]", c)
	}
	var applied bool
	for _, e := range p.logEntries("backoff applied") {
		applied = applied || e["upstream"] == "f2-u"
	}
	if !applied {
		t.Error("no backoff applied log entry")
	}
	// Backoff really applies: the next request is turned away.
	if time.Since(failedAt) < 700*time.Millisecond {
		expectAPIError(t, p.chat(chatBody("f2", true)), http.StatusServiceUnavailable, "all_upstreams_cooling")
	}
	faultEventually(t, 30*time.Second, "inflight 0", func() bool { return p.upstreamGauge("inflight", "f2-u", "f2-p") == 0 })
}

// TestFaultStreamCut: the upstream connection breaks mid-stream.
func TestFaultStreamCut(t *testing.T) {
	events := faultEvents(3, "cut")
	half := events[2][:40]
	cases := []struct {
		name   string
		behave http.HandlerFunc
		want   string // what the client gets before the error event
	}{
		{"tcp reset", resetAfter(events[:2]), strings.Join(events[:2], "")},
		{"chunked unexpected EOF", faultChunkedCut(events[:2]), strings.Join(events[:2], "")},
		// The half-written event is closed before the error event so that the
		// error is an event of its own.
		{"cut inside an event", faultChunkedCut(append(events[:2:2], half)), strings.Join(events[:2], "") + half + "\n\n"},
	}
	var providers, upstreams, models []map[string]any
	for i, c := range cases {
		up := newUpstream(t, c.behave)
		id := fmt.Sprintf("f3-%d", i)
		providers = append(providers, obj("id", id, "url", up.base()))
		upstreams = append(upstreams, obj("id", id+"-u", "provider", id, "model", "x"))
		models = append(models, obj("name", id, "upstreams", []string{id + "-u"}))
	}
	// A clean end after a finish reason, without [DONE], is a whole answer
	// (without either it is a cut: unfinished_stream_test.go).
	finished := append(events[:3:3], `data: {"id":"chatcmpl-cut","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
	clean := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { writeStream(w, finished, 0) })
	providers = append(providers, obj("id", "f3-clean", "url", clean.base()))
	upstreams = append(upstreams, obj("id", "f3-clean-u", "provider", "f3-clean", "model", "x"))
	models = append(models, obj("name", "f3-clean", "upstreams", []string{"f3-clean-u"}))
	// A gzip-encoded stream (passed through compressed) cut halfway.
	gz, _ := storedGzip([]byte(strings.Join(events, "")))
	gzSent := string(gz[:len(gz)/2])
	gzCut := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		conn, brw := faultHijack(w)
		defer conn.Close()
		writeRawChunked(brw, []string{gzSent}, "Content-Encoding", "gzip")
	})
	providers = append(providers, obj("id", "f3-gz", "url", gzCut.base()))
	upstreams = append(upstreams, obj("id", "f3-gz-u", "provider", "f3-gz", "model", "x"))
	models = append(models, obj("name", "f3-gz", "upstreams", []string{"f3-gz-u"}))
	p := startProxy(t, cfg(providers, upstreams, models, "heartbeat_interval", "50ms"))

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("f3-%d", i)
			before := p.requests(id, id+"-u", id, "net_err")
			resp := p.chat(chatBody(id, true))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			body, err := faultRead(resp)
			faultAbortedWith(t, body, err, c.want, "stream_interrupted")
			if d := p.requests(id, id+"-u", id, "net_err") - before; d != 1 {
				t.Errorf("result net_err counted %v times, want 1", d)
			}
		})
	}
	t.Run("compressed stream: aborted, no plain-text event spliced in", func(t *testing.T) {
		before := p.requests("f3-gz", "f3-gz-u", "f3-gz", "net_err")
		resp := p.chat(chatBody("f3-gz", true), "Accept-Encoding", "gzip")
		body, err := faultRead(resp)
		if err == nil {
			t.Error("the body ended with a clean EOF; an aborted transfer was expected")
		}
		if body != gzSent {
			t.Errorf("client got %q, want exactly the compressed bytes the upstream sent %q", body, gzSent)
		}
		if d := p.requests("f3-gz", "f3-gz-u", "f3-gz", "net_err") - before; d != 1 {
			t.Errorf("result net_err counted %v times, want 1", d)
		}
	})
	t.Run("clean EOF after a finish reason without [DONE] passes as it came", func(t *testing.T) {
		before := p.requests("f3-clean", "f3-clean-u", "f3-clean", "ok")
		resp := p.chat(chatBody("f3-clean", true))
		body, err := faultRead(resp)
		if err != nil {
			t.Fatalf("the body did not end cleanly: %v", err)
		}
		body, _ = faultStripKeepalives(t, body) // a loaded machine may pause 50ms
		if want := strings.Join(finished, ""); body != want {
			t.Errorf("body\n got %q\nwant %q", body, want)
		}
		if d := p.requests("f3-clean", "f3-clean-u", "f3-clean", "ok") - before; d != 1 {
			t.Errorf("result ok counted %v times, want 1", d)
		}
	})
	if strings.Contains(strings.ToLower(p.logs()), "panic") {
		t.Error("a panic was logged")
	}
}

// TestFaultStreamRequestTimeout: request_timeout ends a stream that keeps
// sending.
func TestFaultStreamRequestTimeout(t *testing.T) {
	up := newUpstream(t, faultTrickle(50*time.Millisecond))
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "f4-p", "url", up.base())},
		[]map[string]any{obj("id", "f4-u", "provider", "f4-p", "model", "x")},
		[]map[string]any{obj("name", "f4", "upstreams", []string{"f4-u"})},
		"request_timeout", "600ms"))
	before := p.requests("f4", "f4-u", "f4-p", "timeout")
	start := time.Now()
	resp := p.chat(chatBody("f4", true))
	body, err := faultRead(resp)
	elapsed := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The trickle's events, in order, as many as fitted in the window.
	stripped, _ := faultStripKeepalives(t, body)
	var want strings.Builder
	for i := 0; want.Len() < len(stripped) && i < 1000; i++ {
		want.WriteString(faultEvents(1, fmt.Sprintf("t%d", i))[0])
		if strings.HasPrefix(stripped[want.Len():], `data: {"error"`) {
			break
		}
	}
	faultAbortedWith(t, body, err, want.String(), "request_timeout")
	if elapsed < 600*time.Millisecond || elapsed > 5*time.Second {
		t.Errorf("cut after %v, want about request_timeout (600ms)", elapsed)
	}
	if d := p.requests("f4", "f4-u", "f4-p", "timeout") - before; d != 1 {
		t.Errorf("result timeout counted %v times, want 1", d)
	}
}

// TestFaultHeartbeats: keepalive comments while the upstream is silent,
// only between events; nothing added to a stream that never pauses.
func TestFaultHeartbeats(t *testing.T) {
	events := append(faultEvents(4, "hb"), "data: [DONE]\n\n")
	cut := len(events[2]) / 2
	pieces := []string{events[0], events[1], events[2][:cut], events[2][cut:], events[3], events[4]}
	pauses := map[int]time.Duration{
		2: 500 * time.Millisecond, // silent between two events
		3: 350 * time.Millisecond, // silent inside an event
	}
	silent := newUpstream(t, faultPieces(pieces, pauses))
	steady := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { writeStream(w, events, 30*time.Millisecond) })
	jsonBody := `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"slow"},"finish_reason":"stop"}]}`
	slowJSON := newUpstream(t, faultPieces([]string{jsonBody[:50], jsonBody[50:]}, map[int]time.Duration{1: 350 * time.Millisecond},
		"Content-Type", "application/json"))
	hbConf := func(interval string) map[string]any {
		return cfg(
			[]map[string]any{
				obj("id", "f5-silent", "url", silent.base(), "stream_idle_timeout", "2s"),
				obj("id", "f5-steady", "url", steady.base(), "stream_idle_timeout", "2s"),
				obj("id", "f5-json", "url", slowJSON.base(), "stream_idle_timeout", "2s"),
			},
			[]map[string]any{
				obj("id", "f5-silent-u", "provider", "f5-silent", "model", "x"),
				obj("id", "f5-steady-u", "provider", "f5-steady", "model", "x"),
				obj("id", "f5-json-u", "provider", "f5-json", "model", "x"),
			},
			[]map[string]any{
				obj("name", "f5-silent", "upstreams", []string{"f5-silent-u"}),
				obj("name", "f5-steady", "upstreams", []string{"f5-steady-u"}),
				obj("name", "f5-json", "upstreams", []string{"f5-json-u"}),
			},
			"heartbeat_interval", interval)
	}
	p := startProxy(t, hbConf("100ms"))

	t.Run("silent upstream", func(t *testing.T) {
		resp := p.chat(chatBody("f5-silent", true))
		body, err := faultRead(resp)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d err %v", resp.StatusCode, err)
		}
		rest, n := faultStripKeepalives(t, body)
		if want := strings.Join(pieces, ""); rest != want {
			t.Errorf("stream without heartbeats is not the upstream's\n got %q\nwant %q", rest, want)
		}
		if n < 2 {
			t.Errorf("%d heartbeats during a 500ms silence with heartbeat_interval 100ms, want at least 2 (body %q)", n, body)
		}
		// None while the upstream paused inside event 3 (the boundary rule
		// above); at least two in the silence between events 2 and 3.
		i := strings.Index(body, events[1]) + len(events[1])
		gap := body[i : i+strings.Index(body[i:], "data:")]
		if gap != strings.Repeat(faultKeepalive, len(gap)/len(faultKeepalive)) || len(gap) < 2*len(faultKeepalive) {
			t.Errorf("between events 2 and 3, want only heartbeats, at least 2: %q", gap)
		}
	})
	t.Run("steady upstream is byte for byte", func(t *testing.T) {
		// Events 30ms apart; the interval leaves room for a loaded machine.
		p.load(hbConf("1s"))
		resp := p.chat(chatBody("f5-steady", true))
		body, err := faultRead(resp)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d err %v", resp.StatusCode, err)
		}
		if want := strings.Join(events, ""); body != want {
			t.Errorf("body\n got %q\nwant %q", body, want)
		}
	})
	t.Run("never on a non-stream response", func(t *testing.T) {
		resp := p.chat(chatBody("f5-json", false))
		body, err := faultRead(resp)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d err %v", resp.StatusCode, err)
		}
		if body != jsonBody {
			t.Errorf("body\n got %q\nwant %q", body, jsonBody)
		}
	})
}

// TestFaultRetryAfter: an upstream's Retry-After (seconds, HTTP date,
// retry-after-ms) cools it, bounded by retry_after_max, and a probe does not
// cut that short.
func TestFaultRetryAfter(t *testing.T) {
	good := newUpstream(t, nil)
	// conf routes model id to [id-u (the rate-limited upstream), good-u].
	conf := func(id, url string, backoff bool, extra ...any) map[string]any {
		prov := obj("id", id, "url", url, "probe_interval", "100ms", "first_byte_timeout", "1s")
		if backoff {
			prov["backoff"] = "30s"
		}
		return cfg(
			[]map[string]any{prov, obj("id", "f6-good", "url", good.base())},
			[]map[string]any{obj("id", id+"-u", "provider", id, "model", "x"), obj("id", "f6-good-u", "provider", "f6-good", "model", "g")},
			[]map[string]any{obj("name", id, "upstreams", []string{id + "-u", "f6-good-u"}), obj("name", id+"-alone", "upstreams", []string{id + "-u"})},
			extra...)
	}
	p := startProxy(t, conf("f6-init", good.base(), false))

	cases := []struct {
		name     string
		hdr      func() []string
		backoff  bool
		extra    []any
		min, max float64 // expected cooling right after the 429, seconds
	}{
		{"seconds with backoff", func() []string { return []string{"Retry-After", "2"} }, true, nil, 1.7, 2},
		{"seconds without backoff", func() []string { return []string{"Retry-After", "2"} }, false, nil, 1.7, 2},
		{"http date", func() []string {
			return []string{"Retry-After", time.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat)}
		}, false, nil, 1.7, 3},
		{"retry-after-ms", func() []string { return []string{"retry-after-ms", "1500"} }, false, nil, 1.2, 1.5},
		{"bounded by retry_after_max", func() []string { return []string{"Retry-After", "3600"} }, true, []any{"retry_after_max", "2s"}, 1.7, 2},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("f6-%d", i)
			var calls atomic.Int64
			ra := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					status(http.StatusTooManyRequests, c.hdr()...)(w, r)
					return
				}
				completion("back")(w, r)
			})
			p.load(conf(id, ra.base(), c.backoff, c.extra...))
			before := p.requests(id, id+"-u", id, "429")
			start := time.Now()
			resp := p.chat(chatBody(id, false))
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"hello"`) {
				t.Fatalf("want the second upstream's answer: status %d body %s", resp.StatusCode, body)
			}
			if e := time.Since(start); e > 1500*time.Millisecond {
				t.Errorf("failover took %v: it must not wait for the Retry-After", e)
			}
			if d := p.requests(id, id+"-u", id, "429") - before; d != 1 {
				t.Errorf("result 429 counted %v times, want 1", d)
			}
			cooling := p.upstreamGauge("cooling_seconds", id+"-u", id)
			if since := time.Since(start).Seconds(); cooling < c.min-since || cooling > c.max {
				t.Errorf("cooling_seconds = %.3f %.3fs after the 429, want in [%.1f, %.1f]", cooling, since, c.min, c.max)
			}
			// The next request skips it (if this machine is quick enough to send
			// it while the cooling surely lasts).
			sent := time.Since(start).Seconds()
			resp = p.chat(chatBody(id, false))
			body = readAll(t, resp)
			if sent < c.min-0.3 {
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"hello"`) {
					t.Fatalf("second request: status %d body %s", resp.StatusCode, body)
				}
				if n := calls.Load(); n != 1 {
					t.Errorf("the cooling upstream got %d requests, want 1", n)
				}
			} else {
				t.Logf("second request sent %.2fs after the 429: too late to check the skip", sent)
			}
			// It comes back when the Retry-After has passed, not before.
			faultEventually(t, time.Duration(c.max*float64(time.Second))+30*time.Second, "cooling over", func() bool {
				return p.upstreamGauge("cooling_seconds", id+"-u", id) == 0
			})
			if back := time.Since(start).Seconds(); back < c.min {
				t.Errorf("back after %.2fs, want at least %.1fs", back, c.min)
			}
			resp = p.chat(chatBody(id, false))
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"back"`) {
				t.Errorf("after the cooling: status %d body %s, want the first upstream's answer", resp.StatusCode, body)
			}
		})
	}

	t.Run("all cooling 503 reports the time left", func(t *testing.T) {
		// A long Retry-After, so that the countdown is still running however
		// slow this machine is: the check is made from measured times, not
		// from assumed ones.
		const retryAfter = 60 * time.Second
		ra := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "60"))
		p.load(conf("f6-all", ra.base(), true))
		t0 := time.Now()
		expectAPIError(t, p.chat(chatBody("f6-all-alone", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
		t1 := time.Now()
		// The 429 came in [t0, t1]: it cools until 60s after. A request in
		// [a, b] must be told ceil(time left) seconds, one second apart less.
		last := 1 << 30
		for i := 0; i < 2; i++ {
			a := time.Now()
			resp := p.chat(chatBody("f6-all-alone", false))
			b := time.Now()
			if b.Sub(t0) > retryAfter-time.Second {
				t.Fatalf("the cooling was over before the check ran (%v after the 429)", b.Sub(t0))
			}
			msg := expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_cooling")
			got, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			lo := int(math.Ceil((t0.Add(retryAfter).Sub(b)).Seconds()))
			hi := int(math.Ceil((t1.Add(retryAfter).Sub(a)).Seconds()))
			if got < lo || got > hi || got >= last {
				t.Errorf("Retry-After = %d, want the seconds left: in [%d, %d] and less than the previous %d", got, lo, hi, last)
			}
			if !strings.Contains(msg, fmt.Sprintf("retry in %ds", got)) {
				t.Errorf("message %q does not say retry in %ds", msg, got)
			}
			last = got
			time.Sleep(1100 * time.Millisecond)
		}
	})

	t.Run("a probe does not end a Retry-After cooling", func(t *testing.T) {
		var calls atomic.Int64
		ra := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				status(http.StatusTooManyRequests, "Retry-After", "2")(w, r)
				return
			}
			completion("back")(w, r) // healthy right after the 429
		})
		p.load(conf("f6-probe", ra.base(), true))
		probes := func() float64 {
			return p.metric("llm_proxy_probe_pings_total", "upstream", "f6-probe-u", "provider", "f6-probe", "result", "ok") +
				p.metric("llm_proxy_probe_pings_total", "upstream", "f6-probe-u", "provider", "f6-probe", "result", "fail")
		}
		probesBefore := probes()
		start := time.Now()
		if resp := p.chat(chatBody("f6-probe", false)); readAll(t, resp) == "" || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		// The 429 came after start, so the cooling lasts until start+2s at
		// least; probes run every 100ms meanwhile (if they were allowed).
		for time.Since(start) < 1700*time.Millisecond {
			c := p.upstreamGauge("cooling_seconds", "f6-probe-u", "f6-probe")
			if since := time.Since(start); c <= 0 && since < 2*time.Second {
				t.Fatalf("cooling ended after %v, before the Retry-After (2s)", since)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("the upstream got %d requests during its Retry-After (probes included), want 1", n)
		}
		if d := probes() - probesBefore; d != 0 {
			t.Errorf("%v probes during the Retry-After", d)
		}
		faultEventually(t, 30*time.Second, "cooling over", func() bool {
			return p.upstreamGauge("cooling_seconds", "f6-probe-u", "f6-probe") == 0
		})
		resp := p.chat(chatBody("f6-probe", false))
		if body := readAll(t, resp); !strings.Contains(body, `"back"`) {
			t.Errorf("after the Retry-After: status %d body %s", resp.StatusCode, body)
		}
	})
}

// storedGzip builds a gzip member holding data in one stored (uncompressed)
// deflate block, so the compressed bytes contain data verbatim: a split
// right after an event's blank line looks like an event boundary to
// anything that does not check Content-Encoding.
func storedGzip(data []byte) (gz []byte, dataStart int) {
	gz = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0x01}
	gz = binary.LittleEndian.AppendUint16(gz, uint16(len(data)))
	gz = binary.LittleEndian.AppendUint16(gz, ^uint16(len(data)))
	dataStart = len(gz)
	gz = append(gz, data...)
	gz = binary.LittleEndian.AppendUint32(gz, crc32.ChecksumIEEE(data))
	gz = binary.LittleEndian.AppendUint32(gz, uint32(len(data)))
	return gz, dataStart
}

// TestFaultMalformedUpstreamData: with think_tags split, data the rewriter
// cannot or must not parse passes through untouched.
func TestFaultMalformedUpstreamData(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "f7-p", "url", up.base(), "think_tags", "split")},
		[]map[string]any{obj("id", "f7-u", "provider", "f7-p", "model", "x")},
		[]map[string]any{obj("name", "f7", "upstreams", []string{"f7-u"})},
		"heartbeat_interval", "100ms", "max_rewrite_size", 1<<20))

	ev := faultEvents(2, "mal")
	big := fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"x","choices":[{"index":0,"delta":{"content":"<think>%s</think>"},"finish_reason":null}]}`+"\n\n",
		strings.Repeat("y", 3<<19))
	thinkStream := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"x","choices":[{"index":0,"delta":{"content":"<think>hmm</think>ok"},"finish_reason":null}]}` + "\n\ndata: [DONE]\n\n"
	thinkJSON := `{"id":"c","object":"chat.completion","created":1,"model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"<think>hmm</think>ok"},"finish_reason":"stop"}]}`
	gzipped := func(s string) string {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(s))
		_ = zw.Close()
		return b.String()
	}
	stored, dataStart := storedGzip([]byte(thinkStream))
	storedSplit := dataStart + strings.Index(thinkStream, "\n\n") + 2
	if zr, err := gzip.NewReader(bytes.NewReader(stored)); err != nil {
		t.Fatal(err)
	} else if b, err := io.ReadAll(zr); err != nil || string(b) != thinkStream {
		t.Fatalf("storedGzip is broken: %v", err)
	}

	cases := []struct {
		name   string
		stream bool
		pieces []string
		pauses map[int]time.Duration
		hdr    []string
		gzip   bool // client sends Accept-Encoding: gzip; compare raw bytes
		cut    bool // no finish reason, no [DONE]: ended with the error event
	}{
		{name: "data line not JSON", stream: true, pieces: []string{ev[0], "data: {not json at all\n\n", "data: plain words\n\n", ": a comment\n\n", ev[1], "data: [DONE]\n\n"}},
		{name: "event over max_rewrite_size", stream: true, pieces: []string{ev[0], big, ev[1], "data: [DONE]\n\n"}},
		// Without a finish reason or [DONE] the end is a cut: the bytes as
		// they came, then the error event.
		{name: "not SSE at all", stream: true, pieces: []string{"this is not an event stream\n", "at all, <think>no</think>"}, cut: true},
		{name: "gzip stream", stream: true, pieces: []string{gzipped(thinkStream)}, hdr: []string{"Content-Encoding", "gzip"}, gzip: true},
		{name: "gzip completion", pieces: []string{gzipped(thinkJSON)}, hdr: []string{"Content-Encoding", "gzip", "Content-Type", "application/json"}, gzip: true},
		// A pause after compressed bytes that happen to end in a blank line:
		// a heartbeat there would corrupt the compressed body.
		{name: "gzip stream with a pause", stream: true, pieces: []string{string(stored[:storedSplit]), string(stored[storedSplit:])},
			pauses: map[int]time.Duration{1: 350 * time.Millisecond}, hdr: []string{"Content-Encoding", "gzip"}, gzip: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up.setHandler(faultPieces(c.pieces, c.pauses, c.hdr...))
			calls := len(up.Calls())
			before := p.requests("f7", "f7-u", "f7-p", "ok")
			var hdr []string
			if c.gzip {
				hdr = []string{"Accept-Encoding", "gzip"}
			}
			cut0 := p.requests("f7", "f7-u", "f7-p", "net_err")
			resp := p.chat(chatBody("f7", c.stream), hdr...)
			body, err := faultRead(resp)
			if c.cut {
				faultAbortedWith(t, body, err, strings.Join(c.pieces, "")+"\n\n", "stream_interrupted")
				if d := p.requests("f7", "f7-u", "f7-p", "net_err") - cut0; d != 1 {
					t.Errorf("result net_err counted %v times, want 1", d)
				}
				return
			}
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d err %v", resp.StatusCode, err)
			}
			want := strings.Join(c.pieces, "")
			if !c.gzip {
				body, _ = faultStripKeepalives(t, body)
			}
			if body != want {
				t.Errorf("client body differs from the upstream's (%d vs %d bytes)\n got %q\nwant %q", len(body), len(want), tail(body, 300), tail(want, 300))
			}
			if c.gzip {
				if ce := resp.Header.Get("Content-Encoding"); ce != "gzip" {
					t.Errorf("Content-Encoding = %q, want gzip", ce)
				}
				if ae := up.Calls()[calls].Header.Get("Accept-Encoding"); ae != "identity" {
					t.Errorf("upstream Accept-Encoding = %q, want identity (think_tags rewrites need plain bodies)", ae)
				}
			}
			if d := p.requests("f7", "f7-u", "f7-p", "ok") - before; d != 1 {
				t.Errorf("result ok counted %v times, want 1", d)
			}
		})
	}
	if strings.Contains(strings.ToLower(p.logs()), "panic") {
		t.Error("a panic was logged")
	}
}

// TestFaultRequestHygiene: client credentials and hop-by-hop headers stay at
// the proxy; provider headers and the key go upstream; the key is nowhere
// else.
func TestFaultRequestHygiene(t *testing.T) {
	const key = "sk-env-fault-hygiene-7f3a"
	t.Setenv("LLM_ROUTE_FAULT_KEY", key)
	up := newUpstream(t, nil)
	bad := newUpstream(t, status(http.StatusInternalServerError))
	credURL := strings.Replace(closedURL(t), "http://", "http://someuser:hunter2pass@", 1)
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "f8-p", "url", up.base(), "key", "{env.LLM_ROUTE_FAULT_KEY}",
				"headers", map[string]string{"HTTP-Referer": "https://app.example", "X-Title": "fault test"},
				"forward_headers", []string{"X-Kept"}),
			obj("id", "f8-bad", "url", bad.base(), "key", "{env.LLM_ROUTE_FAULT_KEY}"),
			obj("id", "f8-cred", "url", credURL, "key", "{env.LLM_ROUTE_FAULT_KEY}"),
		},
		[]map[string]any{
			obj("id", "f8-u", "provider", "f8-p", "model", "x"),
			obj("id", "f8-bad-u", "provider", "f8-bad", "model", "x"),
			obj("id", "f8-cred-u", "provider", "f8-cred", "model", "x"),
		},
		[]map[string]any{
			obj("name", "f8", "upstreams", []string{"f8-u"}),
			obj("name", "f8-bad", "upstreams", []string{"f8-bad-u"}),
			obj("name", "f8-cred", "upstreams", []string{"f8-cred-u", "f8-u"}),
		},
	))

	// A raw request, so that exactly these headers go out.
	body := chatBody("f8", false)
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy.test\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n" +
		"Authorization: Bearer client-secret-authz\r\n" +
		"Proxy-Authorization: Basic Y2xpZW50LXNlY3JldA==\r\n" +
		"Cookie: session=client-secret-cookie\r\n" +
		"X-Api-Key: client-secret-x-api-key\r\n" +
		"Api-Key: client-secret-api-key\r\n" +
		"Connection: close, X-Custom\r\n" +
		"X-Custom: client-hop-by-hop\r\n" +
		"Keep-Alive: timeout=5\r\n" +
		"Proxy-Connection: keep-alive\r\n" +
		"Te: trailers\r\n" +
		"Upgrade: example/1\r\n" +
		"X-Kept: end-to-end\r\n\r\n" + body
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	calls := up.Calls()
	if len(calls) != 1 {
		t.Fatalf("upstream calls = %d", len(calls))
	}
	h := calls[0].Header
	for _, k := range []string{"Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key", "X-Custom", "Keep-Alive",
		"Proxy-Connection", "Te", "Upgrade"} {
		if v, ok := h[k]; ok {
			t.Errorf("client header %s reached the upstream: %q", k, v)
		}
	}
	for k, vv := range h {
		for _, v := range vv {
			if strings.Contains(v, "client-") || k == "Connection" && !strings.EqualFold(v, "close") {
				t.Errorf("upstream header %s: %q", k, v)
			}
		}
	}
	if got := h.Values("Authorization"); len(got) != 1 || got[0] != "Bearer "+key {
		t.Errorf("upstream Authorization = %q, want the provider key", got)
	}
	if h.Get("HTTP-Referer") != "https://app.example" || h.Get("X-Title") != "fault test" {
		t.Errorf("provider headers missing: HTTP-Referer %q X-Title %q", h.Get("HTTP-Referer"), h.Get("X-Title"))
	}
	if h.Get("X-Kept") != "end-to-end" {
		t.Errorf("an end-to-end header was dropped: X-Kept %q", h.Get("X-Kept"))
	}

	// Errors: an upstream 5xx and a connection failure to a URL with
	// credentials in it.
	errBody := readAll(t, p.chat(chatBody("f8-bad", false)))
	if resp := p.chat(chatBody("f8-cred", true)); resp.StatusCode != http.StatusOK {
		t.Errorf("f8-cred: status %d", resp.StatusCode)
	} else {
		readAll(t, resp)
	}
	adminResp, err := testClient.Get(p.admin + "/config/")
	if err != nil {
		t.Fatal(err)
	}
	adminCfg := readAll(t, adminResp)
	if !strings.Contains(adminCfg, "{env.LLM_ROUTE_FAULT_KEY}") {
		t.Errorf("GET /config/ does not show the placeholder: %s", adminCfg)
	}
	logs := p.logs()
	if !strings.Contains(logs, "upstream connection failed") {
		t.Error("the connection failure was not logged")
	}
	for where, text := range map[string]string{"log": logs, "error body": errBody, "/metrics": p.metrics(), "GET /config/": adminCfg} {
		if strings.Contains(text, key) {
			t.Errorf("the provider key appears in the %s", where)
		}
		if strings.Contains(text, "client-secret") {
			t.Errorf("a client credential appears in the %s", where)
		}
	}
	if strings.Contains(logs, "hunter2pass") {
		t.Error("URL credentials appear in the log")
	}
}

// TestFaultSlowClientIsNotAStall: a client that stops reading for longer
// than stream_idle_timeout while the upstream keeps sending is not an
// upstream stall: the stream completes and the upstream is not penalised.
func TestFaultSlowClientIsNotAStall(t *testing.T) {
	ev := faultEvents(1, strings.Repeat("x", 4000))[0]
	n := (24 << 20) / len(ev) // more than the socket buffers on the way hold
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < n; i++ {
			if _, err := io.WriteString(w, ev); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "f9-p", "url", up.base(), "stream_idle_timeout", "1s", "backoff", "10s", "probe_interval", "0s")},
		[]map[string]any{obj("id", "f9-u", "provider", "f9-p", "model", "x")},
		[]map[string]any{obj("name", "f9", "upstreams", []string{"f9-u"})}))
	before := p.requests("f9", "f9-u", "f9-p", "ok")
	resp := p.chat(chatBody("f9", true))
	head := make([]byte, 1000)
	if _, err := io.ReadFull(resp.Body, head); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the client dawdles; the upstream never pauses
	rest, err := faultRead(resp)
	body := string(head) + rest
	if err != nil || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Contains(tail(body, 500), `"error"`) {
		t.Fatalf("stream cut while the client was slow: err %v, %d bytes, tail %q", err, len(body), tail(body, 200))
	}
	if want := n*len(ev) + len("data: [DONE]\n\n"); len(body) != want {
		t.Errorf("got %d bytes, want %d", len(body), want)
	}
	if d := p.requests("f9", "f9-u", "f9-p", "ok") - before; d != 1 {
		t.Errorf("result ok counted %v times, want 1", d)
	}
	if s := p.upstreamGauge("fail_streak", "f9-u", "f9-p"); s != 0 {
		t.Errorf("a slow client counted as an upstream failure: fail_streak %v", s)
	}
}
