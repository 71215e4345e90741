package integration

// The harness runs a real Caddy in this test process (caddy.Load, the same
// path as the admin API's /load) with the llm_route module, and fake
// upstream servers that behave like real providers: real SSE framing, real
// status codes, hangs, resets. Tests in this package run one at a time: they
// share the process-wide Caddy instance.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llm-route/caddy-llm-route"
)

// freePort returns a loopback port that was free a moment ago.
//
// The kernel may hand a closed port out again at once, and Caddy binds
// with SO_REUSEPORT: a proxy whose admin and HTTP ports came out equal
// would share one port between the two servers and answer some requests
// from the admin mux ("404 page not found"). So a port is never given out
// twice in one test process.
func freePort(t testing.TB) int {
	t.Helper()
	givenPortsMu.Lock()
	defer givenPortsMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !givenPorts[port] {
			givenPorts[port] = true
			return port
		}
	}
}

var (
	givenPortsMu sync.Mutex
	givenPorts   = map[int]bool{}
)

// proxy is a running Caddy with one llm_route handler.
type proxy struct {
	t       testing.TB
	URL     string // http://127.0.0.1:port
	admin   string // http://127.0.0.1:port of the admin API
	logPath string
	port    int
	aport   int
	// next are handlers placed after llm_route in the route.
	next []any
	// storage is the root of the config's file_system storage (made on
	// first use, one per proxy): what llm_route persists stays with the
	// test, and a restart of the same proxy finds it again.
	storage string
}

// startProxy loads a Caddy config whose only route is the given llm_route
// handler JSON (an object without "handler"). It is stopped when the test
// ends.
func startProxy(t testing.TB, handler map[string]any) *proxy {
	t.Helper()
	p := &proxy{t: t, port: freePort(t), aport: freePort(t)}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	p.admin = fmt.Sprintf("http://127.0.0.1:%d", p.aport)
	p.logPath = filepath.Join(t.TempDir(), "caddy.log")
	p.load(handler)
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping caddy: %v", err)
		}
	})
	return p
}

// startWholeConfig runs a whole Caddy config as an example or an adapter
// wrote it, on ports the caller already put in it; only the log moves, to a
// file at INFO (Caddy's default level), so the test reads what a terminal
// would show. Caddy is stopped when the test ends; what names the config in
// a load failure.
func startWholeConfig(t testing.TB, cfg map[string]any, port, adminPort int, what string) *proxy {
	t.Helper()
	p := &proxy{t: t, port: port, aport: adminPort,
		URL:     fmt.Sprintf("http://127.0.0.1:%d", port),
		admin:   fmt.Sprintf("http://127.0.0.1:%d", adminPort),
		logPath: filepath.Join(t.TempDir(), "caddy.log")}
	cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{
		"level":  "INFO",
		"writer": map[string]any{"output": "file", "filename": p.logPath},
	}}}
	loaded, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := loadCaddy(t, loaded); err != nil {
		t.Fatalf("loading %s: %v", what, err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping caddy: %v", err)
		}
	})
	return p
}

// config renders the whole Caddy config around a handler, followed by the
// handlers in p.next (so tests can check what falls through).
func (p *proxy) config(handler map[string]any) []byte {
	h := map[string]any{"handler": "llm_route"}
	for k, v := range handler {
		h[k] = v
	}
	handle := append([]any{h}, p.next...)
	return p.configRoutes([]any{map[string]any{"handle": handle}})
}

// configRoutes renders the whole Caddy config around a list of routes.
func (p *proxy) configRoutes(routes []any) []byte {
	if p.storage == "" {
		p.storage = p.t.TempDir()
	}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": fmt.Sprintf("127.0.0.1:%d", p.aport)},
		"storage": map[string]any{"module": "file_system", "root": p.storage},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"level":  "DEBUG",
			"writer": map[string]any{"output": "file", "filename": p.logPath},
		}}},
		"apps": map[string]any{"http": map[string]any{
			"grace_period": "1ns",
			"servers": map[string]any{"srv0": map[string]any{
				"listen":          []string{fmt.Sprintf("127.0.0.1:%d", p.port)},
				"automatic_https": map[string]any{"disable": true},
				"metrics":         map[string]any{},
				"routes":          routes,
			}},
		}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

// load (re)loads the config, forcing a reload even if unchanged.
func (p *proxy) load(handler map[string]any) {
	p.t.Helper()
	if err := loadCaddy(p.t, p.config(handler)); err != nil {
		p.t.Fatalf("loading config: %v", err)
	}
}

// loadErr loads a config and returns the error.
func (p *proxy) loadErr(handler map[string]any) error {
	return loadCaddy(p.t, p.config(handler))
}

// loadCaddy loads a whole Caddy config (forcing a reload even if unchanged)
// and returns once the servers of the config it replaced no longer listen.
//
// Caddy binds each config's listeners with SO_REUSEPORT and stops the old
// HTTP and admin servers in goroutines that caddy.Load does not wait for.
// Until the old listener closes, the kernel hands some new connections to
// it, and closing it resets them ("connect: connection reset by peer"): a
// test that sends a request right after a reload on a loaded machine would
// fail now and then for a reason that is not the code under test.
func loadCaddy(t testing.TB, cfg []byte) error {
	t.Helper()
	err := caddy.Load(cfg, true)
	awaitOldListeners(t, cfg)
	return err
}

// awaitOldListeners waits until each TCP port cfg listens on (its admin
// endpoint and HTTP servers) has one listening socket left.
func awaitOldListeners(t testing.TB, cfg []byte) {
	t.Helper()
	var c struct {
		Admin struct {
			Listen string `json:"listen"`
		} `json:"admin"`
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		return // caddy.Load has said what is wrong with it
	}
	addrs := []string{c.Admin.Listen}
	for _, srv := range c.Apps.HTTP.Servers {
		addrs = append(addrs, srv.Listen...)
	}
	var ports []uint
	ipv4 := true
	for _, a := range addrs {
		na, err := caddy.ParseNetworkAddress(a)
		if a == "" || err != nil || na.IsUnixNetwork() || na.IsFdNetwork() {
			continue
		}
		ipv4 = ipv4 && net.ParseIP(na.Host).To4() != nil
		for port := na.StartPort; port <= na.EndPort; port++ {
			ports = append(ports, port)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		port, shared := sharedListener(ports, ipv4)
		if !shared {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %d: the previous config's listener is still open 10s after a reload", port)
		}
	}
}

// sharedListener reports a port that more than one socket listens on, from
// the kernel's own table (Caddy's count of a listener's users drops a
// moment before the socket closes). Only the IPv4 table is read when every
// host is IPv4: a read walks every socket of the machine.
func sharedListener(ports []uint, ipv4 bool) (uint, bool) {
	tables := []string{"/proc/net/tcp", "/proc/net/tcp6"}
	if ipv4 {
		tables = tables[:1]
	}
	listening := map[string]int{}
	for _, table := range tables {
		b, err := os.ReadFile(table)
		if err != nil {
			continue // no IPv6, or not Linux: nothing to wait for
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// local_address (hex IP:port) is the second field, the state
			// the fourth; 0A is LISTEN.
			if f := strings.Fields(line); len(f) > 3 && f[3] == "0A" {
				listening[f[1][strings.LastIndexByte(f[1], ':'):]]++
			}
		}
	}
	for _, port := range ports {
		if listening[fmt.Sprintf(":%04X", port)] > 1 {
			return port, true
		}
	}
	return 0, false
}

// logs returns everything Caddy logged so far.
func (p *proxy) logs() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// chat posts a chat completion request body and returns the response.
func (p *proxy) chat(body string, hdr ...string) *http.Response {
	p.t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		p.t.Fatalf("POST chat: %v", err)
	}
	return resp
}

// metrics returns the admin /metrics text.
func (p *proxy) metrics() string {
	p.t.Helper()
	resp, err := testClient.Get(p.admin + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue finds one sample in the metrics text, e.g.
// metricValue(`llm_proxy_upstream_inflight{provider="p",upstream="u"}`).
func (p *proxy) metricValue(series string) (float64, bool) {
	for _, line := range strings.Split(p.metrics(), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}

// readAll reads and closes a response body.
func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---- fake upstream ----

// upstreamCall is one request a fake upstream received.
type upstreamCall struct {
	Path   string
	Header http.Header
	Body   []byte
}

// fakeUpstream is an OpenAI-compatible server whose behaviour each test
// scripts. It records every call and its own peak concurrency.
type fakeUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	calls []upstreamCall
	// modelLists are the GET …/models requests (the start-up path check).
	modelLists []upstreamCall
	handler    http.HandlerFunc
	inflight   atomic.Int64
	peak       atomic.Int64
}

// newUpstream starts a fake upstream; behave answers each request (nil =
// a normal completion, streaming or not as the request asks).
func newUpstream(t testing.TB, behave http.HandlerFunc) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{handler: behave}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models") {
			// The handler's start-up check of the provider url: answered
			// like a provider, and kept apart from the calls tests count.
			f.mu.Lock()
			f.modelLists = append(f.modelLists, upstreamCall{Path: r.URL.Path, Header: r.Header.Clone()})
			f.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
			return
		}
		n := f.inflight.Add(1)
		defer f.inflight.Add(-1)
		for {
			p := f.peak.Load()
			if n <= p || f.peak.CompareAndSwap(p, n) {
				break
			}
		}
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.calls = append(f.calls, upstreamCall{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
		h := f.handler
		f.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if h == nil {
			h = completion("hello")
		}
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

// setHandler swaps the behaviour.
func (f *fakeUpstream) setHandler(h http.HandlerFunc) {
	f.mu.Lock()
	f.handler = h
	f.mu.Unlock()
}

// Calls returns a copy of the calls so far.
func (f *fakeUpstream) Calls() []upstreamCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]upstreamCall(nil), f.calls...)
}

// ModelLists returns a copy of the GET …/models requests so far.
func (f *fakeUpstream) ModelLists() []upstreamCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]upstreamCall(nil), f.modelLists...)
}

// base is the provider URL for this upstream.
func (f *fakeUpstream) base() string { return f.URL + "/v1" }

// isStream reports whether a request body asks for a stream.
func isStream(r *http.Request) bool {
	b, _ := io.ReadAll(r.Body)
	var v struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(b, &v)
	return v.Stream
}

// completion answers like a provider: a chat.completion, or an SSE stream
// of chunks ending in [DONE] when the request streams.
func completion(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if isStream(r) {
			writeStream(w, sseChunks(text), 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-123")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, text)
	}
}

// sseChunks splits text into one chunk event per word.
func sseChunks(text string) []string {
	var events []string
	for i, word := range strings.SplitAfter(text, " ") {
		role := ""
		if i == 0 {
			role = `"role":"assistant",`
		}
		events = append(events, fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{%s"content":%q},"finish_reason":null}]}`+"\n\n", role, word))
	}
	events = append(events, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
	return append(events, "data: [DONE]\n\n")
}

// writeStream sends SSE events, flushing each, gap apart.
func writeStream(w http.ResponseWriter, events []string, gap time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for _, ev := range events {
		if _, err := io.WriteString(w, ev); err != nil {
			return
		}
		_ = rc.Flush()
		if gap > 0 {
			time.Sleep(gap)
		}
	}
}

// status answers every request with code and an error body.
func status(code int, hdr ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":{"message":"upstream says %d","type":"upstream"}}`, code)
	}
}

// hang never answers until the client goes away (or release is closed).
func hang(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
}

// resetAfter writes part of a stream then kills the TCP connection.
func resetAfter(events []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, events, 0)
		resetsConnection(w, r)
	}
}

// readSSE reads an SSE body and returns the data payloads.
func readSSE(t testing.TB, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// basicConfig is one provider, one upstream (limit), one model.
func basicConfig(up *fakeUpstream, limit int) map[string]any {
	return map[string]any{
		"providers": []any{map[string]any{"id": "p1", "url": up.base(), "key": "sk-test-secret-1"}},
		"upstreams": []any{map[string]any{"id": "u1", "provider": "p1", "model": "real-model", "max_concurrency": limit}},
		"models":    []any{map[string]any{"name": "m", "upstreams": []string{"u1"}}},
	}
}

// ---- helpers added for the request, routing, reload and metrics tests ----

// testClient talks to the proxy without keeping connections alive: a reload
// shuts the old server down, and a POST on a connection it closed would fail
// without a retry. It also leaves no idle-connection goroutines behind.
var testClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// post is chat without t.Fatal, for goroutines other than the test's.
func (p *proxy) post(ctx context.Context, body string, hdr ...string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return testClient.Do(req)
}

// get fetches a path of the proxy.
func (p *proxy) get(path string) *http.Response {
	p.t.Helper()
	resp, err := testClient.Get(p.URL + path)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	return resp
}

// loadRoutes (re)loads a config made of the given routes and returns the
// error.
func (p *proxy) loadRoutes(routes []any) error {
	return loadCaddy(p.t, p.configRoutes(routes))
}

// series renders a metric sample name with its labels in the order the
// Prometheus text format uses (sorted by name).
func series(name string, labels ...string) string {
	type kv struct{ k, v string }
	var kvs []kv
	for i := 0; i+1 < len(labels); i += 2 {
		kvs = append(kvs, kv{labels[i], labels[i+1]})
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].k < kvs[j].k })
	var b strings.Builder
	b.WriteString(name)
	if len(kvs) > 0 {
		b.WriteByte('{')
		for i, l := range kvs {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%q", l.k, l.v)
		}
		b.WriteByte('}')
	}
	return b.String()
}

// metric returns a sample's value, 0 when the series does not exist (yet).
func (p *proxy) metric(name string, labels ...string) float64 {
	p.t.Helper()
	v, _ := p.metricValue(series(name, labels...))
	return v
}

// requests returns llm_proxy_requests_total for one model/upstream/result.
func (p *proxy) requests(model, upstream, provider, result string) float64 {
	p.t.Helper()
	return p.metric("llm_proxy_requests_total", "model", model, "upstream", upstream, "provider", provider, "result", result)
}

// upstreamGauge returns one of the per-upstream gauges
// (inflight, fail_streak, cooling_seconds).
func (p *proxy) upstreamGauge(gauge, upstream, provider string) float64 {
	p.t.Helper()
	return p.metric("llm_proxy_upstream_"+gauge, "upstream", upstream, "provider", provider)
}

// logEntries returns the structured log entries whose msg is msg.
func (p *proxy) logEntries(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.logs(), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["msg"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// expectAPIError checks that resp is the proxy's own error: status,
// Content-Type application/json, exactly
// {"error":{"message","type","param":null,"code"}} with string values
// (param null, like OpenAI's), and the code. It returns the message.
func expectAPIError(t testing.TB, resp *http.Response, status int, code string) string {
	t.Helper()
	body := readAll(t, resp)
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	// Decoding hides a repeated member: count it in the raw body.
	if n := strings.Count(body, `"param"`); n != 1 {
		t.Errorf("error body has %d \"param\" members: %s", n, body)
	}
	var raw map[string]map[string]any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("error body is not the OpenAI shape: %v: %s", err, body)
	}
	if p, ok := raw["error"]["param"]; len(raw) != 1 || len(raw["error"]) != 4 || !ok || p != nil {
		t.Fatalf("error body is not exactly error.{message,type,param:null,code}: %s", body)
	}
	for _, k := range []string{"message", "type", "code"} {
		if s, ok := raw["error"][k].(string); !ok || s == "" {
			t.Fatalf("error.%s is not a non-empty string: %s", k, body)
		}
	}
	if got := raw["error"]["code"]; got != code {
		t.Errorf("error.code = %v, want %s (body %s)", got, code, body)
	}
	for _, leak := range leakMarkers {
		if strings.Contains(body, leak) {
			t.Errorf("error body leaks %q: %s", leak, body)
		}
	}
	return raw["error"]["message"].(string)
}

// leakMarkers must never appear in an error the proxy writes: provider keys
// used by the tests and pieces of Go transport errors.
var leakMarkers = []string{"sk-test-secret", "sk-env", "dial tcp", "connection refused", "EOF", "127.0.0.1",
	"context deadline", "context canceled", "http: ", "net/http"}

// gate is an upstream behaviour that signals each arrival on arrived and then
// waits for release (closed) or the proxy going away; afterwards it answers
// with then.
type gate struct {
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{arrived: make(chan struct{}, 1024), release: make(chan struct{})}
}

// open lets every held and future request through.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// handler holds each request until the gate opens, then runs then.
func (g *gate) handler(then http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.arrived <- struct{}{}
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
		then(w, r)
	}
}

// waitArrivals waits until n requests arrived at the gate.
func (g *gate) waitArrivals(t testing.TB, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-g.arrived:
		case <-timeout:
			t.Fatalf("only %d of %d requests reached the upstream", i, n)
		}
	}
}

// result of a request run in the background.
type result struct {
	status int
	body   string
	header http.Header
	err    error
}

// goChat posts in the background; the result arrives on the channel.
func (p *proxy) goChat(ctx context.Context, body string, hdr ...string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := p.post(ctx, body, hdr...)
		if err != nil {
			ch <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- result{status: resp.StatusCode, body: string(b), header: resp.Header, err: err}
	}()
	return ch
}

// await waits for a background request.
func await(t testing.TB, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("background request: %v", r.err)
		}
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("background request did not finish")
	}
	return result{}
}

// chatBody is a minimal request for model m.
func chatBody(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, model, stream)
}

// closedURL is a base URL where nothing listens: the connection is refused.
func closedURL(t testing.TB) string {
	return fmt.Sprintf("http://127.0.0.1:%d/v1", freePort(t))
}

// cfg builds a handler config from providers, upstreams and models given as
// JSON-like maps.
func cfg(providers, upstreams, models []map[string]any, extra ...any) map[string]any {
	h := map[string]any{"providers": providers, "upstreams": upstreams, "models": models}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i].(string)] = extra[i+1]
	}
	return h
}

// obj builds a map from key/value pairs.
func obj(kv ...any) map[string]any {
	m := make(map[string]any, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// script is an upstream behaviour that holds every request until the test
// releases it, one at a time in arrival order, and then answers it with the
// next scripted behaviour. It makes the order of concurrent outcomes
// deterministic.
type script struct {
	mu      sync.Mutex
	arrived chan struct{}
	turns   []chan http.HandlerFunc
	next    int
}

func newScript() *script { return &script{arrived: make(chan struct{}, 1024)} }

func (s *script) handler(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	turn := make(chan http.HandlerFunc, 1)
	s.turns = append(s.turns, turn)
	s.mu.Unlock()
	s.arrived <- struct{}{}
	select {
	case h := <-turn:
		h(w, r)
	case <-r.Context().Done():
	}
}

// answer lets the earliest request not yet answered through with h.
func (s *script) answer(t testing.TB, h http.HandlerFunc) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next >= len(s.turns) {
		t.Fatalf("script: no request waiting for answer %d", s.next+1)
	}
	s.turns[s.next] <- h
	s.next++
}

// waitArrivals waits until n more requests arrived.
func (s *script) waitArrivals(t testing.TB, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-s.arrived:
		case <-timeout:
			t.Fatalf("only %d of %d requests reached the upstream", i, n)
		}
	}
}
