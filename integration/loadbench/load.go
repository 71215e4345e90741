package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// scenario is one load shape: an upstream mode and a number of client
// connections.
type scenario struct {
	name  string
	mode  string
	conns int
	// throughput scenarios enter the requests/s geomean budget.
	throughput bool
	// base and cpuLimit: llm_route's CPU/request in this scenario must stay
	// within cpuLimit × its CPU/request in the chat scenario base (the
	// front scenarios' budgets, issues #11 and #12).
	base     string
	cpuLimit float64
	// state "redis": llm_route runs with `state redis` against the
	// benchmark's redis-server (redis.go); memory names the scenario of the
	// memory llm_route it is compared with, and rpsMin its budget: req/s at
	// least rpsMin × the memory scenario's (issue #16).
	state  string
	memory string
	rpsMin float64
}

// scenarios are the six of issue #7 and the four front scenarios, in run
// order.
var scenarios = []scenario{
	{name: "nonstream-16", mode: modeNonStream, conns: 16, throughput: true},
	{name: "nonstream-64", mode: modeNonStream, conns: 64, throughput: true},
	// nonstream-64 through a router model (its rule resolution); llm_route
	// only: the baseline build may predate router models.
	{name: "router-nonstream-64", mode: modeRouter, conns: 64, base: "nonstream-64", cpuLimit: 1.05},
	{name: "stream-16", mode: modeStream, conns: 16, throughput: true},
	{name: "stream-64", mode: modeStream, conns: 64, throughput: true},
	// stream-64 through a model with repeat_guard on (no loop in the
	// answer); llm_route and reverse_proxy only: the baseline build may
	// predate the guard.
	{name: "guard-stream-64", mode: modeGuard, conns: 64, base: "stream-64", cpuLimit: 1.1},
	{name: "paced-32", mode: modePaced, conns: 32},
	{name: "think-split-64", mode: modeThink, conns: 64},
	// The protocol fronts (fronts.go).
	{name: "messages-native-64", mode: modeMsgNative, conns: 64, base: "stream-64", cpuLimit: 1.1},
	{name: "messages-native-nonstream-64", mode: modeMsgNonStream, conns: 64, base: "nonstream-64", cpuLimit: 1.1},
	{name: "messages-translated-64", mode: modeMsgTranslated, conns: 64, base: "stream-64", cpuLimit: 1.5},
	{name: "responses-translated-64", mode: modeRespTransl, conns: 64, base: "stream-64", cpuLimit: 1.5},
	{name: "gemini-translated-64", mode: modeGeminiTransl, conns: 64, base: "stream-64", cpuLimit: 1.5},
	// The shared state in Redis (redis.go), at the memory scenarios'
	// concurrency.
	{name: "redis-nonstream-64", mode: modeNonStream, conns: 64, state: "redis", memory: "nonstream-64", rpsMin: 0.7},
	{name: "redis-stream-64", mode: modeStream, conns: 64, state: "redis", memory: "stream-64"},
}

// streams reports whether a mode's answer is an event stream.
func streams(mode string) bool {
	return mode != modeNonStream && mode != modeMsgNonStream && mode != modeRouter
}

// runResult is the measurement of one scenario against one target.
type runResult struct {
	requests int64 // valid responses completed in the window
	errors   int64 // invalid responses and transport errors, warm-up included
	errKinds map[string]int64
	wall     time.Duration // the measurement window
	lat      []time.Duration
	ttfe     []time.Duration // streams only
	proxyCPU time.Duration   // utime+stime of the proxy over the window
	selfCPU  time.Duration   // this process (load generator + fake upstream)
	upConns  int64           // TCP connections the upstream accepted in the window
	all      int64           // valid responses in any phase (warm-up, window, tail)
	maxLat   time.Duration   // slowest valid response in any phase (stall detector)

	// The redis scenarios only: redis-server's CPU over the window, the
	// commands it ran over the whole run (warm-up to the last response, so
	// they divide by all+errors), and llm_route's state errors meanwhile.
	stateCPU  time.Duration
	stateCmds map[string]int64
	stateErrs float64
	onRedis   bool // healthy at the start and no state error: on Redis throughout
}

// loadRun drives one target with one scenario: warm-up, then a measured
// window, closed loop (each connection sends its next request as soon as the
// previous response ended).
type loadRun struct {
	p      *payloads
	target *proxyProc
	up     *fakeUpstream
	sc     scenario
	// statePID is redis-server's in the redis scenarios: its CPU is read
	// at the same instants as the proxy's.
	statePID string

	body   []byte
	header http.Header
	echo   string // the model the upstream must have received
	client *http.Client

	measuring atomic.Bool
	stop      atomic.Bool

	mu  sync.Mutex
	res runResult
}

// newLoadRun prepares the request and its expected echo for target and sc.
func newLoadRun(p *payloads, target *proxyProc, up *fakeUpstream, sc scenario) *loadRun {
	lr := &loadRun{p: p, target: target, up: up, sc: sc}
	lr.body = p.reqNonStream
	switch sc.mode {
	case modeStream, modePaced:
		lr.body = p.reqStream
	case modeThink:
		lr.body = p.reqThink
	case modeMsgNative:
		lr.body = p.fr.reqMsgStream
	case modeMsgNonStream:
		lr.body = p.fr.reqMsgNonStream
	case modeRouter:
		lr.body = p.reqRouter
	case modeGuard:
		lr.body = p.reqGuard
	case modeMsgTranslated:
		lr.body = p.fr.reqMsgTranslated
	case modeRespTransl:
		lr.body = p.fr.reqResp
	case modeGeminiTransl:
		lr.body = p.fr.reqGemini
	}
	switch {
	case target.kind == kindPlain && sc.mode == modeRouter:
		lr.echo = routerModel
	case target.kind == kindPlain && sc.mode == modeGuard:
		lr.echo = clientGuardModel
	case target.kind == kindPlain && sc.mode == modeThink:
		lr.echo = clientThinkModel
	case target.kind == kindPlain && (sc.mode == modeMsgNative || sc.mode == modeMsgNonStream):
		lr.echo = clientMsgModel
	case target.kind == kindPlain:
		lr.echo = clientModel
	case sc.mode == modeThink:
		lr.echo = realThinkModel
	default:
		lr.echo = realModel
	}
	lr.header = http.Header{
		"Content-Type":  {"application/json"},
		"Accept":        {"application/json, text/event-stream"},
		"Authorization": {"Bearer sk-client-key"},
		"User-Agent":    {"llm-route-loadbench/1"},
		modeHeader:      {sc.mode},
	}
	if frontPath(sc.mode) == "/v1/messages" {
		lr.header["Anthropic-Version"] = []string{"2023-06-01"} // as the Anthropic SDKs send it
	}
	if sc.mode == modeGeminiTransl {
		lr.header["X-Goog-Api-Key"] = []string{"sk-client-key"} // as the Google SDKs send it
		lr.header["Accept"] = nil
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxConnsPerHost:     sc.conns,
		MaxIdleConnsPerHost: sc.conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		WriteBufferSize:     8 << 10,
		ReadBufferSize:      16 << 10,
	}
	lr.client = &http.Client{Transport: tr, Timeout: 60 * time.Second}
	lr.res.errKinds = map[string]int64{}
	return lr
}

// run executes warm-up and the measured window and returns the result.
func (lr *loadRun) run(warmup, window time.Duration) (runResult, error) {
	var wg sync.WaitGroup
	for i := 0; i < lr.sc.conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lr.worker()
		}()
	}
	time.Sleep(warmup)

	cpu0, err := procCPU(lr.target.pid)
	if err != nil {
		lr.stop.Store(true)
		wg.Wait()
		return runResult{}, err
	}
	self0, _ := procCPU("self")
	state0 := lr.stateCPU()
	conns0 := lr.up.conns.Load()
	start := time.Now()
	lr.measuring.Store(true)

	time.Sleep(window)

	lr.measuring.Store(false)
	wall := time.Since(start)
	cpu1, err := procCPU(lr.target.pid)
	self1, _ := procCPU("self")
	state1 := lr.stateCPU()
	conns1 := lr.up.conns.Load()
	lr.stop.Store(true)
	wg.Wait()
	lr.client.CloseIdleConnections()
	if err != nil {
		return runResult{}, err
	}

	lr.mu.Lock()
	defer lr.mu.Unlock()
	r := lr.res
	r.wall = wall
	r.proxyCPU = cpu1 - cpu0
	r.selfCPU = self1 - self0
	r.stateCPU = state1 - state0
	r.upConns = conns1 - conns0
	return r, nil
}

// stateCPU is redis-server's CPU so far, 0 without one.
func (lr *loadRun) stateCPU() time.Duration {
	if lr.statePID == "" {
		return 0
	}
	d, _ := procCPU(lr.statePID)
	return d
}

// worker is one client connection's closed loop.
func (lr *loadRun) worker() {
	var buf []byte
	var lat, ttfe []time.Duration
	var ok, bad, all int64
	var maxLat time.Duration
	kinds := map[string]int64{}
	for !lr.stop.Load() {
		start := time.Now()
		var first time.Duration
		var err error
		buf, first, err = lr.do(buf[:0], start)
		end := time.Now()
		if err == nil {
			err = lr.validate(buf)
		}
		if err != nil {
			// Every error counts, warm-up included: none goes unreported.
			bad++
			kinds[errKind(err)]++
			time.Sleep(5 * time.Millisecond) // do not spin on a dead proxy
			continue
		}
		all++
		maxLat = max(maxLat, end.Sub(start))
		// Measure the requests that completed inside the window: their
		// count over the window is the throughput, and matches the CPU the
		// proxy burnt in it (in-flight work at both edges evens out).
		if !lr.measuring.Load() {
			continue
		}
		ok++
		lat = append(lat, end.Sub(start))
		if streams(lr.sc.mode) {
			ttfe = append(ttfe, first)
		}
	}
	lr.mu.Lock()
	defer lr.mu.Unlock()
	lr.res.requests += ok
	lr.res.errors += bad
	lr.res.all += all
	lr.res.maxLat = max(lr.res.maxLat, maxLat)
	lr.res.lat = append(lr.res.lat, lat...)
	lr.res.ttfe = append(lr.res.ttfe, ttfe...)
	for k, n := range kinds {
		lr.res.errKinds[k] += n
	}
}

// validationError is a response that arrived but is wrong.
type validationError struct{ msg string }

func (e *validationError) Error() string { return e.msg }

func invalid(format string, args ...any) error {
	return &validationError{fmt.Sprintf(format, args...)}
}

// errKind shortens an error to a stable category for the report.
func errKind(err error) string {
	if ve, ok := err.(*validationError); ok {
		return ve.msg
	}
	s := err.Error()
	for _, k := range []string{"connection reset", "connection refused", "EOF", "timeout", "broken pipe"} {
		if strings.Contains(s, k) {
			return "transport: " + k
		}
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return "transport: " + s
}

// do sends one request, reads the whole body into buf and returns it with
// the time to the first complete SSE event (streams).
func (lr *loadRun) do(buf []byte, start time.Time) ([]byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost,
		lr.target.url+frontURL(lr.sc.mode), bytes.NewReader(lr.body))
	if err != nil {
		return buf, 0, err
	}
	req.Header = lr.header
	resp, err := lr.client.Do(req)
	if err != nil {
		return buf, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return buf, 0, invalid("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	if got := resp.Header.Get(echoHeader); got != lr.echo {
		_, _ = io.Copy(io.Discard, resp.Body)
		return buf, 0, invalid("upstream got model %q, want %q", got, lr.echo)
	}
	var first time.Duration
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, 8<<10)...)[:len(buf)]
		}
		n, err := resp.Body.Read(buf[len(buf):cap(buf)])
		if n > 0 {
			prev := len(buf)
			buf = buf[:prev+n]
			if first == 0 && streams(lr.sc.mode) && (bytes.Contains(buf[max(prev-1, 0):], []byte("\n\n")) ||
				bytes.Contains(buf[max(prev-3, 0):], []byte("\r\n\r\n"))) { // Google's framing
				first = time.Since(start)
			}
		}
		if err == io.EOF {
			return buf, first, nil
		}
		if err != nil {
			return buf, first, err
		}
	}
}

// validate checks a complete 200 body: byte for byte where nothing may
// change, event by event for think_tags split.
func (lr *loadRun) validate(body []byte) error {
	var want []byte
	switch lr.sc.mode {
	case modeNonStream, modeRouter:
		if !bytes.Equal(body, lr.p.completion) {
			return invalid("non-stream body differs (%d bytes, want %d)", len(body), len(lr.p.completion))
		}
		return nil
	case modeStream, modePaced, modeGuard:
		want = lr.p.streamBody
	case modeThink:
		if lr.target.kind == kindLLM {
			return validateSplit(body, lr.p)
		}
		want = lr.p.thinkBody
	case modeMsgNonStream:
		if !bytes.Equal(body, lr.p.fr.msgCompletion) {
			return invalid("messages non-stream body differs (%d bytes, want %d)", len(body), len(lr.p.fr.msgCompletion))
		}
		return nil
	case modeMsgNative:
		want = lr.p.fr.msgStreamBody
	case modeMsgTranslated:
		if lr.target.kind == kindLLM {
			return validateMessagesStream(body, lr.p.fr.text)
		}
		want = lr.p.fr.msgStreamBody
	case modeRespTransl:
		if lr.target.kind == kindLLM {
			return validateResponsesStream(body, lr.p.fr.text)
		}
		want = lr.p.fr.respBody
	case modeGeminiTransl:
		if lr.target.kind == kindLLM {
			return validateGeminiStream(body, lr.p.fr.text)
		}
		want = lr.p.fr.geminiBody
	}
	if bytes.Equal(body, want) {
		return nil
	}
	n, done := countEvents(body)
	return invalid("stream differs: %d data events, [DONE]=%v, %d bytes (want %d events, [DONE], %d bytes)",
		n, done, len(body), streamEvents, len(want))
}

// countEvents counts the data events before [DONE] and whether [DONE] is
// the last event.
func countEvents(body []byte) (n int, done bool) {
	for _, ev := range bytes.Split(body, []byte("\n\n")) {
		if len(ev) == 0 {
			continue
		}
		if bytes.Equal(ev, []byte("data: [DONE]")) {
			done = true
			continue
		}
		if bytes.HasPrefix(ev, []byte("data: ")) {
			n++
			done = false
		}
	}
	return n, done
}

// chunk is the part of a chat.completion.chunk that think_tags rewrites.
type chunk struct {
	Choices []struct {
		Delta struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"delta"`
	} `json:"choices"`
}

// validateSplit checks an llm_route think_tags split stream: at least the
// upstream's data events (a held tail may add one), [DONE] last, no tag in
// any content, and content and reasoning_content reassembling exactly to the
// reference split of the upstream's text.
func validateSplit(body []byte, p *payloads) error {
	var content, reasoning strings.Builder
	n, done := 0, false
	for _, ev := range bytes.Split(body, []byte("\n\n")) {
		if len(ev) == 0 {
			continue
		}
		data, ok := bytes.CutPrefix(ev, []byte("data: "))
		if !ok {
			return invalid("think-split: event without data: %.40q", ev)
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			continue
		}
		n++
		done = false
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return invalid("think-split: bad chunk JSON: %v", err)
		}
		for _, ch := range c.Choices {
			if s := ch.Delta.Content; s != nil {
				if strings.Contains(*s, "<think") || strings.Contains(*s, "</think") || strings.Contains(*s, "think>") {
					return invalid("think-split: tag fragment in content %q", *s)
				}
				content.WriteString(*s)
			}
			if s := ch.Delta.ReasoningContent; s != nil {
				reasoning.WriteString(*s)
			}
		}
	}
	switch {
	case n < streamEvents:
		return invalid("think-split: %d data events, want >= %d", n, streamEvents)
	case !done:
		return invalid("think-split: no final [DONE]")
	case content.String() != p.thinkContent:
		return invalid("think-split: content %q, want %q", content.String(), p.thinkContent)
	case reasoning.String() != p.thinkReasoning:
		return invalid("think-split: reasoning_content %q, want %q", reasoning.String(), p.thinkReasoning)
	}
	return nil
}

// probeOnce sends a single request of sc to target and validates it; it is
// the pre-flight check that both proxies work before any load.
func probeOnce(p *payloads, target *proxyProc, up *fakeUpstream, sc scenario) error {
	lr := newLoadRun(p, target, up, sc)
	defer lr.client.CloseIdleConnections()
	body, _, err := lr.do(nil, time.Now())
	if err == nil {
		err = lr.validate(body)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %v (see %s)", target.name, sc.name, err, target.log)
	}
	return nil
}
