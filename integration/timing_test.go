package integration

// Timing hardening (issue 10 items 1, 3, 4): a client that stops reading,
// streams whose [DONE] reached the client, request_timeout after the first
// byte, a non-stream rewrite that breaks before its status went out, and
// waiting out a cooling with no queue_timeout.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// floodOnce answers its first request with an endless stream of large
// events (until the proxy goes away) and every later one with a normal
// completion.
func floodOnce() http.HandlerFunc {
	var n atomic.Int64
	ev := faultEvents(1, strings.Repeat("x", 4000))[0]
	return func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			completion("second")(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for {
			if _, err := io.WriteString(w, ev); err != nil {
				return
			}
		}
	}
}

// stuckClient sends a streaming chat request over a raw TCP connection with
// a small receive buffer, reads the status line and then never reads again.
func stuckClient(t *testing.T, p *proxy, model string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	body := chatBody(model, true)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	line, err := bufio.NewReaderSize(conn, 16).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("status line %q, err %v", line, err)
	}
	return conn
}

// loadServerOpts loads handler with extra options on the Caddy server.
func loadServerOpts(t *testing.T, p *proxy, handler map[string]any, opts map[string]any) {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(p.config(handler), &c); err != nil {
		t.Fatal(err)
	}
	srv := c["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"].(map[string]any)
	for k, v := range opts {
		srv[k] = v
	}
	b, _ := json.Marshal(c)
	if err := loadCaddy(t, b); err != nil {
		t.Fatal(err)
	}
}

// TestClientStopsReading: a client that takes the status line and then no
// more bytes loses its slot after client_write_timeout (or request_timeout
// when that is off), as cancelled, and the upstream is not backed off.
func TestClientStopsReading(t *testing.T) {
	for _, tc := range []struct {
		name       string
		extra      []any
		serverOpts map[string]any
		within     time.Duration
	}{
		{"client_write_timeout", []any{"client_write_timeout", "1s"}, nil, 12 * time.Second},
		{"request_timeout bounds a blocked write", []any{"client_write_timeout", "0s", "request_timeout", "2s"},
			map[string]any{"write_idle_timeout": -1}, 12 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, floodOnce())
			conf := cfg(
				[]map[string]any{obj("id", "t1-p", "url", up.base(), "backoff", "10s", "probe_interval", "0s", "max_concurrency", 1)},
				[]map[string]any{obj("id", "t1-u", "provider", "t1-p", "model", "x")},
				[]map[string]any{obj("name", "t1", "upstreams", []string{"t1-u"}, "queue_size", 4, "queue_timeout", "60s")},
				append([]any{"heartbeat_interval", "0s"}, tc.extra...)...)
			p := startProxy(t, conf)
			if tc.serverOpts != nil {
				loadServerOpts(t, p, conf, tc.serverOpts)
			}
			cancelled := p.requests("t1", "t1-u", "t1-p", "cancelled")
			stuckClient(t, p, "t1")
			if n := p.upstreamGauge("inflight", "t1-u", "t1-p"); n != 1 {
				t.Fatalf("inflight %v with the stuck client, want 1", n)
			}
			start := time.Now()
			ch := p.goChat(context.Background(), chatBody("t1", false))
			select {
			case r := <-ch:
				if r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, "second") {
					t.Fatalf("second request: %d %v %s", r.status, r.err, r.body)
				}
			case <-time.After(tc.within):
				t.Fatalf("the stuck client still holds the only slot after %v", tc.within)
			}
			t.Logf("slot freed after %v", time.Since(start))
			if d := p.requests("t1", "t1-u", "t1-p", "cancelled") - cancelled; d != 1 {
				t.Errorf("result cancelled counted %v times, want 1", d)
			}
			if s := p.upstreamGauge("fail_streak", "t1-u", "t1-p"); s != 0 {
				t.Errorf("fail_streak %v: the upstream was blamed for a stuck client", s)
			}
			if c := p.upstreamGauge("cooling_seconds", "t1-u", "t1-p"); c != 0 {
				t.Errorf("cooling_seconds %v: the upstream was backed off for a stuck client", c)
			}
			faultEventually(t, 30*time.Second, "inflight 0", func() bool { return p.upstreamGauge("inflight", "t1-u", "t1-p") == 0 })
		})
	}
}

// TestStreamDoneThenClientCloses: the openai SDK stops at data: [DONE] and
// closes; the upstream closes a little later. The stream is ok.
func TestStreamDoneThenClientCloses(t *testing.T) {
	events := sseChunks("all of it")
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, events, 0)
		select { // the upstream lingers before it closes
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	})
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "t3-p", "url", up.base(), "backoff", "10s", "probe_interval", "0s")},
		[]map[string]any{obj("id", "t3-u", "provider", "t3-p", "model", "x")},
		[]map[string]any{obj("name", "t3", "upstreams", []string{"t3-u"})}))
	ok := p.requests("t3", "t3-u", "t3-p", "ok")
	cancelled := p.requests("t3", "t3-u", "t3-p", "cancelled")
	resp := p.chat(chatBody("t3", true))
	sc := bufio.NewScanner(resp.Body)
	sawDone := false
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			sawDone = true
			break
		}
	}
	resp.Body.Close() // right after [DONE], like the SDK
	if !sawDone {
		t.Fatal("no [DONE] reached the client")
	}
	faultEventually(t, 30*time.Second, "the attempt recorded", func() bool {
		return p.requests("t3", "t3-u", "t3-p", "ok")+p.requests("t3", "t3-u", "t3-p", "cancelled") > ok+cancelled
	})
	if d := p.requests("t3", "t3-u", "t3-p", "ok") - ok; d != 1 {
		t.Errorf("result ok counted %v times, want 1", d)
	}
	if d := p.requests("t3", "t3-u", "t3-p", "cancelled") - cancelled; d != 0 {
		t.Errorf("result cancelled counted %v times, want 0", d)
	}
	var logged bool
	for _, e := range p.logEntries("request completed") {
		if e["model"] == "t3" {
			logged = true
			if e["result"] != "ok" {
				t.Errorf("request log result %v, want ok", e["result"])
			}
		}
	}
	if !logged {
		t.Error("no request completed log entry")
	}
}

// TestStreamRequestTimeoutNotBlamed: request_timeout after the first byte
// ends the stream with its error event, counts timeout, and does not back
// the upstream off (a long generation is not its fault).
func TestStreamRequestTimeoutNotBlamed(t *testing.T) {
	up := newUpstream(t, faultTrickle(50*time.Millisecond))
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "t4-p", "url", up.base(), "backoff", "30s", "probe_interval", "0s")},
		[]map[string]any{obj("id", "t4-u", "provider", "t4-p", "model", "x")},
		[]map[string]any{obj("name", "t4", "upstreams", []string{"t4-u"})},
		"request_timeout", "600ms"))
	before := p.requests("t4", "t4-u", "t4-p", "timeout")
	resp := p.chat(chatBody("t4", true))
	body, err := faultRead(resp)
	if err == nil {
		t.Error("the body ended with a clean EOF; an aborted transfer was expected")
	}
	body, _ = faultStripKeepalives(t, body)
	if _, code, err := faultSplitErrorEvent(body); err != nil || code != "request_timeout" {
		t.Fatalf("final event: code %q, %v", code, err)
	}
	if d := p.requests("t4", "t4-u", "t4-p", "timeout") - before; d != 1 {
		t.Errorf("result timeout counted %v times, want 1", d)
	}
	if s := p.upstreamGauge("fail_streak", "t4-u", "t4-p"); s != 0 {
		t.Errorf("fail_streak %v after a request_timeout, want 0", s)
	}
	if c := p.upstreamGauge("cooling_seconds", "t4-u", "t4-p"); c != 0 {
		t.Errorf("cooling_seconds %v after a request_timeout, want 0", c)
	}
	// The next request is served, not turned away as cooling.
	resp = p.chat(chatBody("t4", true))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("next request: status %d", resp.StatusCode)
	}
}

// TestThinkRewriteBodyBreaksFailsOver: a non-stream body that is rewritten
// as a whole is read before the status goes out, so an upstream that
// breaks inside it fails over instead of aborting a 200.
func TestThinkRewriteBodyBreaksFailsOver(t *testing.T) {
	broken := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		conn, brw := faultHijack(w)
		defer faultReset(conn)
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n" +
			`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"<think>`)
		_ = brw.Flush()
		time.Sleep(50 * time.Millisecond)
	})
	good := newUpstream(t, completion("<think>hm</think>fine"))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "t5-broken", "url", broken.base(), "think_tags", "split"),
			obj("id", "t5-good", "url", good.base(), "think_tags", "split"),
		},
		[]map[string]any{
			obj("id", "t5-broken-u", "provider", "t5-broken", "model", "x"),
			obj("id", "t5-good-u", "provider", "t5-good", "model", "x"),
		},
		[]map[string]any{obj("name", "t5", "upstreams", []string{"t5-broken-u", "t5-good-u"})}))
	netErrs := p.requests("t5", "t5-broken-u", "t5-broken", "net_err")
	resp := p.chat(chatBody("t5", false))
	body, err := faultRead(resp)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(body, `"content":"fine"`) ||
		!strings.Contains(body, `"reasoning_content":"hm"`) {
		t.Fatalf("want the second upstream's rewritten answer: %d %v %s", resp.StatusCode, err, body)
	}
	if d := p.requests("t5", "t5-broken-u", "t5-broken", "net_err") - netErrs; d != 1 {
		t.Errorf("net_err on the broken upstream counted %v times, want 1", d)
	}
}

// TestQueueTimeoutZeroWaitsForCooling: with queue_timeout 0 ("until the
// client leaves") and every upstream cooling, the request waits for the
// cooling to end instead of getting 503 at once.
func TestQueueTimeoutZeroWaitsForCooling(t *testing.T) {
	up := newUpstream(t, status(500))
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "t6-p", "url", up.base())},
		[]map[string]any{obj("id", "t6-u", "provider", "t6-p", "model", "x", "backoff", "1m", "probe_interval", "0s")},
		[]map[string]any{obj("name", "t6", "upstreams", []string{"t6-u"}, "queue_size", 4, "queue_timeout", "0s")}))
	expectAPIError(t, p.chat(chatBody("t6", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
	if c := p.upstreamGauge("cooling_seconds", "t6-u", "t6-p"); c <= 0 {
		t.Fatalf("cooling_seconds %v after a 500, want the first step", c)
	}
	up.setHandler(completion("back"))
	start := time.Now()
	resp := p.chat(chatBody("t6", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "back") {
		t.Fatalf("want the request to wait out the cooling: %d %s", resp.StatusCode, body)
	}
	t.Logf("served after %v", time.Since(start))
}
