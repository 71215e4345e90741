package integration

// The fault soak (issues #6, #14): a real Caddy with llm_route in front of
// four fake upstream servers (six upstreams) that break at random on every
// request, clients that cancel at random, and a config reload every second
// with changed limits, queue sizes, timeouts, provider capacity and
// prefill settings. Same-upstream retries are on for two providers, and
// three models continue broken streams (resume on): every upstream gives
// the same answer to the same request (derived from the id in its prompt),
// continues an assistant prefill with only the rest, or refuses prefill
// (c1 always, d2 half the time) as newer models do.
//
// Default: a short run (~30s, fits CI with -race). Long run:
//
//	LLM_ROUTE_SOAK=10m go test -count=1 -run Soak -timeout 20m ./integration/
//
// Every random choice follows one seed, printed at the start; replay a run
// with LLMROUTE_SOAK_SEED=<seed> (the timing of a loaded machine still
// differs, so a replay is close, not identical).
//
// Invariants checked at the end:
//   - no panic in Caddy's log, no provider key in it;
//   - every request ended in one of: a JSON completion that parses and holds
//     exactly what the upstream sent (think tags split for the split
//     upstream), a complete SSE stream (likewise, [DONE] last, heartbeats
//     only between events), the upstream's own 400 passed through, an
//     OpenAI-shaped 503 of the proxy, a final SSE error event after a
//     prefix of the upstream's stream followed by an aborted body, or a
//     cancel by the client; anything else fails. Two more endings are
//     accepted only with proof from the upstreams' records: no response at
//     all for a request no upstream saw, sent during a reload (net/http
//     drops a request it reads after the old server's Shutdown began), and
//     a completion aborted mid-body when its upstream trickled the body
//     until request_timeout (a JSON body cannot carry an error event);
//     for a model with resume on, a stream continued elsewhere
//     (soakCheckResumed): one answer, whole or cut by the error event;
//   - no upstream ever had more requests in flight than a limit in force,
//     nor sp-a's upstreams together more than its capacity (the exact
//     invariant is at soakCheckLimits);
//   - streams were resumed (llm_proxy_stream_resumes_total ok > 0) and
//     retried on the same upstream;
//   - afterwards every inflight gauge (upstream and provider) and queue
//     depth is 0 and the goroutine count is back to its baseline.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// soakGrace is how late an upstream may notice that the proxy abandoned a
// request (connection closed) compared to the proxy freeing the slot: the
// server learns it on another goroutine. See soakCheckLimits.
const soakGrace = 150 * time.Millisecond

// soakEnvKey is the provider key given to the proxy as {env.…}.
const soakEnvKey = "sk-soak-env-key-a-5e1d"

// soakKeys are every provider key of the soak, to look for in the logs.
var soakKeys = []string{soakEnvKey, "sk-soak-secret-b-93c2", "sk-soak-secret-c-0a7f", "sk-soak-secret-d-71be"}

// soakClientKey is the client key every soak request sends: a
// budget too large to refuse, so every attempt reserves and settles under
// faults, cancels and reloads; it must never reach the log.
const soakClientKey = "llmr-soak-client-6f3a"

// soakDrop is a request whose answer was missing (the connection closed
// before any response) or, for a completion, cut short.
type soakDrop struct {
	id         int64
	class      string // no_response or json_cut
	start, end time.Time
	what       string
}

// soakDuringReload reports whether [start, end] overlaps a reload (after the
// first load), counting the old server's shutdown a little past the end of
// caddy.Load.
func soakDuringReload(gens []soakGen, start, end time.Time) bool {
	for _, g := range gens[1:] {
		if !start.After(g.end.Add(200*time.Millisecond)) && !end.Before(g.start) {
			return true
		}
	}
	return false
}

// soakRec is one attempt as an upstream saw it.
type soakRec struct {
	upstream string
	id       int64
	arrive   time.Time
	end      time.Time
	fault    string
}

// soakServer is a fake provider that serves some upstreams (told apart by
// the body's model, which is the upstream id) and breaks at random.
type soakServer struct {
	*httptest.Server
	auth  string          // expected Authorization
	think map[string]bool // upstreams that answer with <think> content
	// rejectPrefill is, per upstream, the percentage of requests ending in
	// an assistant message that get a 400, as from providers whose newer
	// models refuse prefill; the others continue the prefilled text (answer
	// only the rest).
	rejectPrefill map[string]int
	// streamFaults replaces soakStreamFaults for some upstreams.
	streamFaults map[string][]soakFault

	mu     sync.Mutex
	rnd    *rand.Rand
	recs   []soakRec
	faults map[string]int

	probes  atomic.Int64
	badAuth atomic.Int64
	badReq  atomic.Int64
}

func newSoakServer(t *testing.T, seed int64, auth string, think ...string) *soakServer {
	s := &soakServer{auth: auth, think: map[string]bool{}, rnd: rand.New(rand.NewSource(seed)), faults: map[string]int{}}
	for _, u := range think {
		s.think[u] = true
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *soakServer) base() string { return s.URL + "/v1" }

type soakFault struct {
	name   string
	weight int
}

var (
	soakStreamFaults = []soakFault{{"ok", 30}, {"junk", 6}, {"trickle", 8}, {"s500", 3}, {"s502", 2}, {"s503", 3},
		{"s429", 6}, {"s402", 2}, {"s400", 3}, {"hang", 4}, {"stall", 5}, {"reset", 5}, {"cut", 5}, {"reset0", 2}}
	// soakBreakFaults break streams mid-way more often than not (d1), and
	// soakSteadyFaults seldom fail (d2, the fallback that takes over).
	soakBreakFaults  = []soakFault{{"ok", 30}, {"junk", 3}, {"trickle", 5}, {"s500", 3}, {"s429", 3}, {"stall", 15}, {"reset", 15}, {"cut", 15}}
	soakSteadyFaults = []soakFault{{"ok", 80}, {"junk", 1}, {"trickle", 4}, {"s500", 1}, {"s429", 1}, {"s400", 1},
		{"stall", 2}, {"reset", 1}, {"cut", 2}}
	soakJSONFaults = []soakFault{{"ok", 40}, {"trickle", 8}, {"s500", 4}, {"s503", 3}, {"s429", 6}, {"s402", 2},
		{"s400", 3}, {"hang", 3}, {"reset0", 3}}
)

// rand helpers under the lock.
func (s *soakServer) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rnd.Intn(n)
}

func (s *soakServer) pick(faults []soakFault) string {
	total := 0
	for _, f := range faults {
		total += f.weight
	}
	n := s.intn(total)
	for _, f := range faults {
		if n < f.weight {
			return f.name
		}
		n -= f.weight
	}
	return "ok"
}

func (s *soakServer) sleep(r *http.Request, min, max int) bool {
	d := time.Duration(min+s.intn(max-min+1)) * time.Millisecond
	select {
	case <-time.After(d):
		return true
	case <-r.Context().Done():
		return false
	}
}

func (s *soakServer) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models") {
		// The handler's start-up check of the provider url.
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	arrive := time.Now()
	body, _ := io.ReadAll(r.Body)
	if r.Header.Get("Authorization") != s.auth {
		s.badAuth.Add(1)
	}
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		s.badReq.Add(1)
	}
	idHdr := r.Header.Get("X-Soak-Id")
	if idHdr == "" { // a probe of a cooling upstream: outside the slots
		s.probes.Add(1)
		if s.intn(10) < 3 {
			status(http.StatusServiceUnavailable)(w, r)
			return
		}
		writeStream(w, sseChunks("4"), 0)
		return
	}
	// The answer follows from the request alone: the id in its prompt
	// (which the header repeats), so that every upstream gives the same
	// answer and a continuation elsewhere can finish it.
	id, _ := strconv.ParseInt(idHdr, 10, 64)
	if len(req.Messages) == 0 || req.Messages[0].Content != soakPrompt(id) {
		s.badReq.Add(1)
	}
	prefill, hasPrefill := "", false
	if n := len(req.Messages); n > 1 && req.Messages[n-1].Role == "assistant" {
		prefill, hasPrefill = req.Messages[n-1].Content, true
	}
	faults := soakJSONFaults
	if req.Stream {
		faults = soakStreamFaults
		if f := s.streamFaults[req.Model]; f != nil {
			faults = f
		}
	}
	fault := s.pick(faults)
	if hasPrefill && s.intn(100) < s.rejectPrefill[req.Model] {
		fault = "prefill_rejected"
	}
	defer func() {
		s.mu.Lock()
		s.recs = append(s.recs, soakRec{upstream: req.Model, id: id, arrive: arrive, end: time.Now(), fault: fault})
		s.faults[fault]++
		s.mu.Unlock()
	}()
	w.Header().Set("X-Soak-Upstream", req.Model)
	w.Header().Set("X-Soak-Fault", fault)
	think := s.think[req.Model]

	switch fault {
	case "s500", "s502", "s503", "s402":
		code, _ := strconv.Atoi(fault[1:])
		status(code)(w, r)
		return
	case "s429":
		if s.intn(2) == 0 {
			w.Header().Set("Retry-After", strconv.Itoa(s.intn(2)))
		} else {
			w.Header().Set("Retry-After-Ms", strconv.Itoa(s.intn(1001)))
		}
		status(http.StatusTooManyRequests)(w, r)
		return
	case "s400":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, soak400)
		return
	case "prefill_rejected":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"This model does not support assistant message prefill. The conversation must end with a user message.","type":"invalid_request_error"}}`)
		return
	case "hang":
		<-r.Context().Done()
		return
	case "reset0":
		conn, _ := faultHijack(w)
		faultReset(conn)
		return
	}

	if !req.Stream {
		b := soakJSON(req.Model, id, think)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if fault == "ok" {
			io.WriteString(w, b)
			return
		}
		// trickle: a few pieces, a pause before each
		rc := http.NewResponseController(w)
		for _, piece := range s.split(b, 1+s.intn(2)) {
			if !s.sleep(r, 50, 150) {
				return
			}
			if _, err := io.WriteString(w, piece); err != nil {
				return
			}
			_ = rc.Flush()
		}
		return
	}

	if !hasPrefill {
		prefill = ""
	}
	events := soakEvents(req.Model, id, think, fault == "junk", s.intn, prefill)
	switch fault {
	case "stall":
		writeStream(w, events[:s.intn(len(events)-1)], 0) // 0 events: headers only
		<-r.Context().Done()
	case "reset":
		writeStream(w, events[:s.intn(len(events)-1)], 0)
		conn, _ := faultHijack(w)
		faultReset(conn)
	case "cut":
		k := s.intn(len(events) - 1)
		sent := append([]string(nil), events[:k]...)
		if s.intn(2) == 0 {
			sent = append(sent, events[k][:1+s.intn(len(events[k])-1)])
		}
		conn, brw := faultHijack(w)
		writeRawChunked(brw, sent, "X-Soak-Upstream", req.Model, "X-Soak-Fault", fault)
		conn.Close()
	default: // ok, junk, trickle
		min, max := 5, 40
		if fault == "trickle" {
			min, max = 80, 250
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i, piece := range s.split(strings.Join(events, ""), 3+s.intn(6)) {
			if i > 0 && !s.sleep(r, min, max) {
				return
			}
			if _, err := io.WriteString(w, piece); err != nil {
				return
			}
			_ = rc.Flush()
		}
	}
}

// split cuts b into n pieces at random offsets.
func (s *soakServer) split(b string, n int) []string {
	var cuts []int
	for i := 1; i < n && len(b) > 1; i++ {
		cuts = append(cuts, 1+s.intn(len(b)-1))
	}
	sort.Ints(cuts)
	var out []string
	prev := 0
	for _, c := range cuts {
		if c > prev {
			out = append(out, b[prev:c])
			prev = c
		}
	}
	return append(out, b[prev:])
}

// soak400 is the upstream's own client error, passed through by the proxy.
const soak400 = `{"error":{"message":"soak says the request is bad","type":"invalid_request_error","code":"soak_bad_request"}}`

// soakPrompt is the user message of request id: the fake upstreams derive
// their answer from it.
func soakPrompt(id int64) string { return fmt.Sprintf("soak request %d", id) }

// soakBody is the chat request of request id.
func soakBody(model string, stream bool, id int64) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"stream":%v}`, model, soakPrompt(id), stream)
}

// soakAnswer is the answer to request id, the same at every upstream;
// soakReasoning is a think upstream's reasoning before it.
func soakAnswer(id int64) string {
	return fmt.Sprintf("soak %d says hello world, and then a few more words so that a stream can break at many places", id)
}
func soakReasoning(up string, id int64) string { return fmt.Sprintf("thinking about %d at %s", id, up) }

// soakText is what the upstream puts in content: the answer, after a think
// block for a split upstream.
func soakText(up string, id int64, think bool) string {
	if think {
		return "<think>" + soakReasoning(up, id) + "</think>" + soakAnswer(id)
	}
	return soakAnswer(id)
}

// soakUpstreams are the soak's upstream ids; each stamps its own chunk id
// and created (soakChunkID, soakCreated), so the client can tell whose
// identity a continued stream carries.
var soakUpstreams = []string{"a1", "a2", "b1", "c1", "d1", "d2"}

func soakChunkID(up string, id int64) string { return fmt.Sprintf("chatcmpl-%s-%d", up, id) }

func soakCreated(up string) int { return 100 + slices.Index(soakUpstreams, up) }

// soakEvents is the SSE stream of request id: a role chunk, the content,
// a finish chunk and [DONE]. For a think upstream the content is cut at
// random places (tags split across chunks); otherwise it is deterministic,
// so the client can check the bytes. junk adds a data line that is not JSON
// and a comment. prefill is the text of a final assistant message: the
// stream continues it (only the rest of the text), as a model does.
func soakEvents(up string, id int64, think, junk bool, intn func(int) int, prefill string) []string {
	text := soakText(up, id, think)
	if prefill != "" {
		rest, ok := strings.CutPrefix(text, prefill)
		if !ok {
			rest = "PREFILL-MISMATCH" // a mix the client's checker must catch
		}
		text = rest
	}
	var parts []string
	if think {
		for len(text) > 0 {
			n := min(len(text), 1+intn(12))
			parts, text = append(parts, text[:n]), text[n:]
		}
	} else {
		parts = strings.SplitAfter(text, " ")
	}
	chunk := func(delta, finish string) string {
		return fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
			soakChunkID(up, id), soakCreated(up), up, delta, finish)
	}
	events := []string{chunk(`{"role":"assistant","content":""}`, "null")}
	for i, p := range parts {
		if p == "" {
			continue
		}
		q, _ := json.Marshal(p)
		events = append(events, chunk(`{"content":`+string(q)+`}`, "null"))
		if junk && i == 0 {
			events = append(events, "data: {soak-junk not json\n\n", ": soak comment\n\n")
		}
	}
	events = append(events, chunk(`{}`, `"stop"`))
	return append(events, "data: [DONE]\n\n")
}

// soakJSON is the non-stream completion of request id.
func soakJSON(up string, id int64, think bool) string {
	q, _ := json.Marshal(soakText(up, id, think))
	return fmt.Sprintf(`{"id":%q,"object":"chat.completion","created":%d,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}]}`,
		soakChunkID(up, id), soakCreated(up), up, q)
}

// soakGen is one config the soak loaded, with the time window of its load
// (its limits were applied somewhere inside it).
type soakGen struct {
	limits     map[string]int
	start, end time.Time
}

// soakForward lets the request id through the client header allow-list:
// the fake upstreams key their faults and answers off it.
var soakForward = []string{"X-Soak-Id"}

// soakConfig draws a config: limits, queue size, timeouts.
func soakConfig(rnd *rand.Rand, a, b, c, d *soakServer) (map[string]any, map[string]int) {
	pick := func(vals ...string) string { return vals[rnd.Intn(len(vals))] }
	limits := map[string]int{"a1": 1 + rnd.Intn(2), "a2": 1 + rnd.Intn(2), "b1": 2 + rnd.Intn(2), "c1": 3 + rnd.Intn(2), "d1": 5 + rnd.Intn(2), "d2": 3 + rnd.Intn(2),
		"sp-a": 2 + rnd.Intn(2)} // sp-a: the provider capacity over a1 and a2
	fb, idle := pick("300ms", "500ms"), pick("300ms", "500ms")
	conf := cfg(
		[]map[string]any{
			obj("id", "sp-a", "url", a.base(), "key", "{env.LLM_ROUTE_SOAK_KEY}", "backoff", "2s", "probe_interval", "200ms",
				"first_byte_timeout", fb, "stream_idle_timeout", idle, "forward_headers", soakForward, "retries", 1,
				"capacity", limits["sp-a"]),
			obj("id", "sp-b", "url", b.base(), "key", soakKeys[1], "think_tags", "split",
				"first_byte_timeout", fb, "stream_idle_timeout", idle, "forward_headers", soakForward),
			obj("id", "sp-c", "url", c.base(), "key", soakKeys[2], "first_byte_timeout", fb, "stream_idle_timeout", idle,
				"forward_headers", soakForward, "retries", rnd.Intn(2), "retry_after_wait", pick("0s", "300ms")),
			obj("id", "sp-d", "url", d.base(), "key", soakKeys[3], "first_byte_timeout", fb, "stream_idle_timeout", idle,
				"forward_headers", soakForward),
		},
		[]map[string]any{
			obj("id", "a1", "provider", "sp-a", "model", "a1", "max_concurrency", limits["a1"]),
			obj("id", "a2", "provider", "sp-a", "model", "a2", "max_concurrency", limits["a2"]),
			obj("id", "b1", "provider", "sp-b", "model", "b1", "max_concurrency", limits["b1"]),
			// c1's server refuses prefill: with prefill on (the default) a
			// continuation there is refused and replayed, with it off replayed.
			obj("id", "c1", "provider", "sp-c", "model", "c1", "max_concurrency", limits["c1"], "backoff", "1s", "probe_interval", "300ms",
				"prefill", rnd.Intn(2) == 0),
			// d1 and d2 serve soak-resume only. d1's streams break mid-way
			// more often than not; d2, second and steadier, is seldom full
			// or cooling, and both cool only briefly (so that soak-resume's
			// requests seldom start on d2): the continuations of d1's broken
			// streams mostly find d2 free. The other resume models' next
			// upstreams are mostly full, so their breaks mostly end in the
			// error event (resume failed: no upstream). d2 refuses half the prefills (replayed on the same
			// slot); with prefill off it is sent replays.
			obj("id", "d1", "provider", "sp-d", "model", "d1", "max_concurrency", limits["d1"], "backoff", "250ms", "probe_interval", "200ms"),
			obj("id", "d2", "provider", "sp-d", "model", "d2", "max_concurrency", limits["d2"], "prefill", rnd.Intn(2) == 0,
				"backoff", "250ms", "probe_interval", "200ms"),
		},
		[]map[string]any{
			// The models without the think upstream continue broken streams.
			obj("name", "soak-fast", "upstreams", []string{"a1", "c1"}, "resume", "on"),
			obj("name", "soak-think", "upstreams", []string{"b1", "a2"}),
			obj("name", "soak-queue", "upstreams", []string{"a2", "c1"}, "queue_size", 2+2*rnd.Intn(3),
				"queue_timeout", pick("500ms", "1s"), "resume", "on"),
			obj("name", "soak-all", "upstreams", []string{"a1", "a2", "b1", "c1"}),
			obj("name", "soak-resume", "upstreams", []string{"d1", "d2"}, "resume", "on"),
		},
		"request_timeout", pick("2s", "3s"), "heartbeat_interval", pick("100ms", "150ms"), "retry_after_max", "1s",
		"keys", []any{obj("id", "soak-client", "secret", "{env.LLM_ROUTE_SOAK_CLIENT}", "tokens_per_day", 1_000_000_000_000)})
	if soakState != nil {
		conf["state"] = soakState
	}
	return conf, limits
}

// soakState is the handler's state block in the soak (nil: memory).
var soakState map[string]any

var soakModels = []string{"soak-fast", "soak-think", "soak-queue", "soak-all", "soak-resume"}

// soakResume are the models with resume on: a stream of theirs may be
// finished by another upstream than the one that started it.
var soakResume = map[string]bool{"soak-fast": true, "soak-queue": true, "soak-resume": true}

// soakDuration is the run length: LLM_ROUTE_SOAK (a Go duration) or 30s.
func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("LLM_ROUTE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LLM_ROUTE_SOAK=%q: %v", v, err)
		}
		return d
	}
	return 30 * time.Second
}

// soakSeed is the seed of every random choice of the run: LLMROUTE_SOAK_SEED
// (an integer, to replay a failed run) or the clock. It is printed either way.
func soakSeed(t *testing.T) int64 {
	if v := os.Getenv("LLMROUTE_SOAK_SEED"); v != "" {
		seed, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("LLMROUTE_SOAK_SEED=%q: want an integer: %v", v, err)
		}
		return seed
	}
	return time.Now().UnixNano()
}

func TestFaultSoak(t *testing.T) {
	duration := soakDuration(t)
	seed := soakSeed(t)
	// Printed on stdout as well as in the test log, so that a run killed by
	// its timeout still shows it; replay with LLMROUTE_SOAK_SEED=<seed>.
	fmt.Printf("soak: %v, seed %d (replay: LLMROUTE_SOAK_SEED=%d)\n", duration, seed, seed)
	t.Logf("soak: %v, seed %d (replay: LLMROUTE_SOAK_SEED=%d)", duration, seed, seed)
	t.Setenv("LLM_ROUTE_SOAK_KEY", soakEnvKey)
	t.Setenv("LLM_ROUTE_SOAK_CLIENT", soakClientKey)
	rnd := rand.New(rand.NewSource(seed))
	a := newSoakServer(t, seed+1, "Bearer "+soakEnvKey)
	b := newSoakServer(t, seed+2, "Bearer "+soakKeys[1], "b1")
	c := newSoakServer(t, seed+3, "Bearer "+soakKeys[2])
	c.rejectPrefill = map[string]int{"c1": 100}
	d := newSoakServer(t, seed+4, "Bearer "+soakKeys[3])
	d.rejectPrefill = map[string]int{"d2": 50}
	d.streamFaults = map[string][]soakFault{"d1": soakBreakFaults, "d2": soakSteadyFaults}
	servers := []*soakServer{a, b, c, d}

	var gens []soakGen
	conf, limits := soakConfig(rnd, a, b, c, d)
	start := time.Now()
	p := startProxy(t, conf)
	load := soakStableListener(t, p)
	load(conf)
	gens = append(gens, soakGen{limits: limits, start: start, end: time.Now()})

	// Warm up, then take the goroutine baseline.
	for _, stream := range []bool{false, true} {
		if resp, err := p.post(context.Background(), soakBody("soak-fast", stream, 0), "X-Soak-Id", "0", "Authorization", "Bearer "+soakClientKey); err == nil {
			_, _ = faultRead(resp)
		}
	}
	settle := func() int {
		for _, s := range servers {
			s.CloseClientConnections()
		}
		runtime.GC()
		return runtime.NumGoroutine()
	}
	time.Sleep(300 * time.Millisecond)
	baseline := settle()

	// Clients.
	const workers = 12
	var (
		nextID     atomic.Int64
		startsMu   sync.Mutex
		starts     = map[int64]time.Time{}
		outcomesMu sync.Mutex
		outcomes   = map[string]int{}
		problems   []string
		suspects   []soakDrop // answers cut short or missing; judged after the run
	)
	nextID.Store(1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed + 100 + int64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := nextID.Add(1)
				model := soakModels[r.Intn(len(soakModels))]
				stream := r.Intn(10) < 6
				var cancelAfter time.Duration
				if r.Intn(10) == 0 {
					cancelAfter = time.Duration(r.Intn(600)) * time.Millisecond
				}
				began := time.Now()
				startsMu.Lock()
				starts[id] = began
				startsMu.Unlock()
				class, problem := soakRequest(p, id, model, stream, cancelAfter)
				if class == "no_response" || class == "json_cut" {
					outcomesMu.Lock()
					suspects = append(suspects, soakDrop{id: id, class: class, start: began, end: time.Now(),
						what: fmt.Sprintf("%s, stream %v: %s", model, stream, problem)})
					outcomesMu.Unlock()
					continue
				}
				if strings.HasPrefix(class, "503") {
					// A client backs off a little before it retries.
					time.Sleep(time.Duration(10+r.Intn(40)) * time.Millisecond)
				}
				outcomesMu.Lock()
				outcomes[class]++
				if problem != "" {
					problems = append(problems, fmt.Sprintf("request %d (%s, stream %v): %s", id, model, stream, problem))
				}
				outcomesMu.Unlock()
			}
		}(w)
	}

	// Reloads, one a second, in the test goroutine.
	deadline := time.Now().Add(duration)
	tick := time.NewTicker(time.Second)
	for time.Now().Before(deadline) {
		<-tick.C
		conf, limits := soakConfig(rnd, a, b, c, d)
		g := soakGen{limits: limits, start: time.Now()}
		load(conf)
		g.end = time.Now()
		gens = append(gens, g)
	}
	tick.Stop()
	close(stop)
	wg.Wait()

	// Quiet again: no slot held, nobody queued.
	faultEventually(t, 60*time.Second, "inflight gauges and queue depths 0", func() bool {
		for _, line := range strings.Split(p.metrics(), "\n") {
			if (strings.HasPrefix(line, "llm_proxy_upstream_inflight{") || strings.HasPrefix(line, "llm_proxy_queue_depth{") ||
				strings.HasPrefix(line, "llm_proxy_provider_inflight{")) &&
				!strings.HasSuffix(line, " 0") {
				return false
			}
		}
		return true
	})

	// Answers cut short or missing are judged with what the upstreams saw.
	attempts := map[int64][]soakRec{}
	for _, srv := range servers {
		srv.mu.Lock()
		for _, r := range srv.recs {
			attempts[r.id] = append(attempts[r.id], r)
		}
		srv.mu.Unlock()
	}
	for _, d := range suspects {
		as := attempts[d.id]
		sort.Slice(as, func(i, j int) bool { return as[i].arrive.Before(as[j].arrive) })
		switch {
		case d.class == "no_response" && len(as) == 0 && soakDuringReload(gens, d.start, d.end):
			// Go's net/http drops, without an answer, a request it reads
			// after the old server's Shutdown began (server.go: "if
			// c.server.shuttingDown() { return }"): the handler never saw it.
			outcomes["dropped_at_reload"]++
		case d.class == "json_cut" && len(as) > 0 && as[len(as)-1].fault == "trickle" &&
			as[len(as)-1].end.Sub(as[len(as)-1].arrive) >= 1900*time.Millisecond:
			// A completion whose body the upstream sent so slowly that
			// request_timeout (2s or 3s) ended it: the status was out, so the
			// proxy can only abort (there is no error event in a JSON body).
			outcomes["json_cut_by_request_timeout"]++
		default:
			outcomes[d.class]++
			problems = append(problems, fmt.Sprintf("request %d (%s): %s; upstream attempts %d", d.id, d.what, d.class, len(as)))
		}
	}

	// Every request ended in a known way.
	total := 0
	for _, n := range outcomes {
		total += n
	}
	// For each problem (the first few): what the upstreams saw of that
	// request and the nearest reload.
	for i, pr := range problems {
		var id int64
		if _, err := fmt.Sscanf(pr, "request %d", &id); err != nil || i >= 20 {
			continue
		}
		for _, s := range servers {
			s.mu.Lock()
			for _, r := range s.recs {
				if r.id == id {
					t.Logf("request %d at %s: fault %s, arrived %s, ended %s", id, r.upstream, r.fault,
						r.arrive.Format("15:04:05.000"), r.end.Format("15:04:05.000"))
				}
			}
			s.mu.Unlock()
		}
		startsMu.Lock()
		st := starts[id]
		startsMu.Unlock()
		var near soakGen
		for _, g := range gens[1:] {
			if near.start.IsZero() || g.start.Sub(st).Abs() < near.start.Sub(st).Abs() {
				near = g
			}
		}
		t.Logf("request %d started %s; nearest reload %s-%s", id, st.Format("15:04:05.000"),
			near.start.Format("15:04:05.000"), near.end.Format("15:04:05.000"))
	}
	for i, pr := range problems {
		if i == 20 {
			t.Errorf("... and %d more", len(problems)-20)
			break
		}
		t.Error(pr)
	}

	// No upstream over its limit.
	var recs []soakRec
	probes := int64(0)
	faults := map[string]int{}
	for _, s := range servers {
		s.mu.Lock()
		recs = append(recs, s.recs...)
		for f, n := range s.faults {
			faults[f] += n
		}
		s.mu.Unlock()
		probes += s.probes.Load()
		if n := s.badAuth.Load(); n > 0 {
			t.Errorf("%d requests reached %s without the provider key", n, s.URL)
		}
		if n := s.badReq.Load(); n > 0 {
			t.Errorf("%d request bodies at %s were not JSON", n, s.URL)
		}
	}
	// sp-a's capacity bounds a1 and a2 together: checked as one more
	// "upstream" whose requests are both of theirs.
	checked := slices.Clone(recs)
	for _, r := range recs {
		if r.upstream == "a1" || r.upstream == "a2" {
			r.upstream = "sp-a"
			checked = append(checked, r)
		}
	}
	startsMu.Lock()
	peaks := soakCheckLimits(t, checked, starts, gens)
	startsMu.Unlock()

	logs := p.logs()
	if strings.Contains(strings.ToLower(logs), "panic") {
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(strings.ToLower(line), "panic") {
				t.Errorf("panic in the log: %s", tail(line, 500))
				break
			}
		}
	}
	for _, k := range soakKeys {
		if strings.Contains(logs, k) {
			t.Errorf("a provider key appears in the log")
		}
	}
	if strings.Contains(logs, soakClientKey) {
		t.Errorf("the client key appears in the log")
	}
	// Every reservation was settled or released: faults, cancels and
	// reloads leak none.
	if k := p.keyStatus("soak-client"); k["reserved_tokens"].(float64) != 0 || k["tokens_today"].(float64) == 0 {
		t.Errorf("client key after the soak: %v (want nothing reserved, tokens counted)", k)
	}
	// sp-a retries once (sp-c at random): its 5xx and resets were retried
	// on the same upstream, inside the limits checked above.
	if n := len(p.logEntries("retrying on the same upstream")); n == 0 {
		t.Error("no same-upstream retry in the whole soak")
	} else {
		t.Logf("%d same-upstream retries", n)
	}

	// Broken streams of the resume models were finished elsewhere.
	resumes := soakResumes(p.metrics())
	if resumes["ok"] == 0 || outcomes["stream_resumed"] == 0 {
		t.Errorf("no stream resumed in the whole soak: llm_proxy_stream_resumes_total %v, %d continued streams seen",
			resumes, outcomes["stream_resumed"])
	} else {
		t.Logf("stream resumes: %v", resumes)
	}
	why := map[string]int{}
	for _, e := range p.logEntries("stream resume failed") {
		why[fmt.Sprint(e["reason"], "@", e["model"], "/", e["from"])]++
	}
	for _, e := range p.logEntries("continuing stream") {
		why["path "+fmt.Sprint(e["path"])]++
	}
	why["prefill rejected"] = len(p.logEntries("prefill rejected, replaying"))
	t.Logf("continuations: %s", soakCounts(why))

	// Goroutines back to the baseline.
	const tolerance = 10
	var n int
	deadlineG := time.Now().Add(20 * time.Second)
	for {
		n = settle()
		if n <= baseline+tolerance {
			break
		}
		if time.Now().After(deadlineG) {
			t.Errorf("goroutines: %d, baseline %d (+%d tolerated); by creator:\n%s", n, baseline, tolerance, soakGoroutines())
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Logf("soak %v: %d requests [%s]; %d attempts at upstreams [%s]; %d probes; %d reloads; peak in flight %s; goroutines %d (baseline %d)",
		duration, total, soakCounts(outcomes), len(recs), soakCounts(faults), probes, len(gens)-1, peaks, n, baseline)
}

// soakStableListener moves the proxy onto a listening socket that outlives
// reloads and returns the loader to use from then on. Caddy on Linux opens a
// new SO_REUSEPORT socket for each config and closes the old one, and the
// kernel resets connections still queued on the old socket: around a reload
// a client can see a connection reset before any response, whatever the
// handler does. Listening on an inherited socket (the "fd/N" network, as
// with systemd socket activation), every config accepts from the same
// socket, so every request of the soak must get an answer.
func soakStableListener(t *testing.T, p *proxy) func(map[string]any) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	p.URL = "http://" + ln.Addr().String()
	_ = ln.Close() // f keeps the socket open
	// The descriptor number, read without f.Fd(): Fd() puts the socket
	// (shared by every dup of it) in blocking mode, and Caddy's accept4 on a
	// dup would then block in the kernel, where closing the listener at the
	// next reload cannot interrupt it.
	var fd uintptr
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(d uintptr) { fd = d }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = caddy.Stop()
		_ = f.Close()
	})
	return func(handler map[string]any) {
		var conf map[string]any
		if err := json.Unmarshal(p.config(handler), &conf); err != nil {
			t.Fatal(err)
		}
		srv := conf["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"].(map[string]any)
		srv["listen"] = []string{fmt.Sprintf("fd/%d", fd)}
		b, _ := json.Marshal(conf)
		if err := loadCaddy(t, b); err != nil {
			t.Fatalf("loading config: %v", err)
		}
	}
}

// soakGoroutines summarises the running goroutines: count per (top frame,
// creator).
func soakGoroutines() string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	groups := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		// Key: the innermost frames outside the runtime and sync packages,
		// and the creator.
		var frames []string
		creator := ""
		for _, l := range strings.Split(g, "\n") {
			switch {
			case strings.HasPrefix(l, "created by "):
				creator = strings.TrimPrefix(l, "created by ")
				if i := strings.Index(creator, " in goroutine"); i > 0 {
					creator = creator[:i]
				}
			case l == "" || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "goroutine "):
			case strings.HasPrefix(l, "runtime.") || strings.HasPrefix(l, "sync.") || strings.HasPrefix(l, "internal/"):
			default:
				if len(frames) < 3 {
					if i := strings.LastIndex(l, "("); i > 0 {
						l = l[:i]
					}
					frames = append(frames, l)
				}
			}
		}
		groups[strings.Join(frames, " < ")+" <- "+creator]++
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(groups)) {
		fmt.Fprintf(&b, "%4d %s\n", groups[k], k)
	}
	return b.String()
}

// soakResumes sums llm_proxy_stream_resumes_total over the models, by result.
func soakResumes(metrics string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, "llm_proxy_stream_resumes_total{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		_, result, _ := strings.Cut(labels, `result="`)
		result, _, _ = strings.Cut(result, `"`)
		v, _ := strconv.ParseFloat(value, 64)
		out[result] += v
	}
	return out
}

// soakCounts renders a count map sorted by key.
func soakCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// soakCheckLimits checks that no upstream ever served more requests at once
// than a slot limit that was in force.
//
// The proxy claims a slot for request R at its admission a(R) only while
// inflight < L(a(R)), the limit in force then, and frees it at r(R), after
// the upstream exchange ended. An upstream sees R from its arrival (after
// a(R)) to the end of its handler. That end precedes r(R) when the proxy
// read the response to its end; when the proxy abandoned the request (a
// timeout, a client cancel) the upstream notices the closed connection a
// little later, on another goroutine: so each upstream interval is cut
// short by soakGrace. Then, for every arrival X, the set S of requests the
// upstream is serving (arrive(R) ≤ arrive(X) < end(R) − soakGrace, and X
// itself) were all held by the proxy at once at a(R*), the latest admission
// among them: |S| ≤ L(a(R*)). a(R*) lies between the earliest client start
// of S and arrive(X), and a limit is in force from some moment of its
// config's load (caddy.Load applies it on the "started" event) until some
// moment of the next load. So:
//
//	|S| ≤ max{ L_g(upstream) : load g started ≤ arrive(X) and
//	                           (g is the last or load g+1 ended ≥ min start(S)) }
//
// A limit lowered by a reload therefore never flags the requests admitted
// before it, which legitimately run on above the new limit.
func soakCheckLimits(t *testing.T, recs []soakRec, starts map[int64]time.Time, gens []soakGen) string {
	t.Helper()
	byUp := map[string][]soakRec{}
	for _, r := range recs {
		byUp[r.upstream] = append(byUp[r.upstream], r)
	}
	var peaks []string
	ups := make([]string, 0, len(byUp))
	for u := range byUp {
		ups = append(ups, u)
	}
	sort.Strings(ups)
	violations := 0
	for _, u := range ups {
		rs := byUp[u]
		sort.Slice(rs, func(i, j int) bool { return rs[i].arrive.Before(rs[j].arrive) })
		var active []soakRec
		peak, maxLimit := 0, 0
		for _, g := range gens {
			maxLimit = max(maxLimit, g.limits[u])
		}
		for _, x := range rs {
			kept := active[:0]
			for _, r := range active {
				if x.arrive.Before(r.end.Add(-soakGrace)) {
					kept = append(kept, r)
				}
			}
			active = kept
			n := len(active) + 1
			peak = max(peak, n)
			earliest := starts[x.id]
			for _, r := range active {
				if s := starts[r.id]; s.Before(earliest) {
					earliest = s
				}
			}
			allowed := 0
			for g := range gens {
				if gens[g].start.After(x.arrive) {
					break
				}
				if g+1 < len(gens) && gens[g+1].end.Before(earliest) {
					continue
				}
				allowed = max(allowed, gens[g].limits[u])
			}
			if n > allowed {
				violations++
				if violations <= 10 {
					t.Errorf("upstream %s served %d requests at once at %s, limits in force allow %d (request %d, fault %s)",
						u, n, x.arrive.Format("15:04:05.000"), allowed, x.id, x.fault)
				}
			}
			if x.arrive.Before(x.end.Add(-soakGrace)) {
				active = append(active, x)
			}
		}
		peaks = append(peaks, fmt.Sprintf("%s=%d/%d", u, peak, maxLimit))
	}
	return strings.Join(peaks, " ")
}

// soakRequest sends one request and classifies how it ended. problem is
// set when it ended in none of the accepted ways.
func soakRequest(p *proxy, id int64, model string, stream bool, cancelAfter time.Duration) (class, problem string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled atomic.Bool
	if cancelAfter > 0 {
		tm := time.AfterFunc(cancelAfter, func() { cancelled.Store(true); cancel() })
		defer tm.Stop()
	}
	resp, err := p.post(ctx, soakBody(model, stream, id), "X-Soak-Id", strconv.FormatInt(id, 10), "Authorization", "Bearer "+soakClientKey)
	if err != nil {
		if cancelled.Load() {
			return "client_cancel", ""
		}
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return "no_response", err.Error()
		}
		return "transport_error", err.Error()
	}
	body, rerr := faultRead(resp)
	if rerr != nil && cancelled.Load() {
		return "client_cancel", ""
	}
	class, problem = soakClassify(resp, body, rerr, id, soakResume[model])
	if problem != "" && cancelled.Load() {
		return "client_cancel", "" // cut by our own cancel, whatever it looked like
	}
	return class, problem
}

// soakProxyCodes are the proxy's own 503 codes.
var soakProxyCodes = map[string]bool{"all_upstreams_failed": true, "all_upstreams_busy": true, "all_upstreams_cooling": true,
	"queue_full": true, "queue_timeout": true}

func soakClassify(resp *http.Response, body string, rerr error, id int64, resume bool) (class, problem string) {
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusBadRequest:
		if rerr != nil || body != soak400 {
			return "bad", fmt.Sprintf("400 that is not the upstream's: err %v body %q", rerr, body)
		}
		return "upstream_400", ""
	case http.StatusServiceUnavailable:
		var e struct {
			Error map[string]any `json:"error"`
		}
		if rerr != nil || json.Unmarshal([]byte(body), &e) != nil || len(e.Error) != 4 || !hasNullParam(e.Error) || resp.Header.Get("Content-Type") != "application/json" {
			return "bad", fmt.Sprintf("503 that is not an OpenAI-shaped error: err %v body %q", rerr, body)
		}
		code, _ := e.Error["code"].(string)
		msg, _ := e.Error["message"].(string)
		if !soakProxyCodes[code] || msg == "" {
			return "bad", fmt.Sprintf("503 with code %q: %s", code, body)
		}
		if code == "all_upstreams_cooling" && resp.Header.Get("Retry-After") == "" {
			return "bad", "cooling 503 without Retry-After"
		}
		return "503:" + code, ""
	default:
		return "bad", fmt.Sprintf("status %d: %q", resp.StatusCode, tail(body, 300))
	}

	up := resp.Header.Get("X-Soak-Upstream")
	think := up == "b1"
	if up == "" {
		return "bad", fmt.Sprintf("200 without the upstream's headers: %v err %v body %q", resp.Header, rerr, tail(body, 300))
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if rerr != nil {
			return "json_cut", fmt.Sprintf("completion body cut: %v after %d bytes", rerr, len(body))
		}
		if !think {
			if want := soakJSON(up, id, false); body != want {
				return "bad", fmt.Sprintf("completion differs from the upstream's:\n got %q\nwant %q", body, want)
			}
			return "json_ok", ""
		}
		var c struct {
			Choices []struct {
				Message struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) != 1 {
			return "bad", fmt.Sprintf("completion does not parse: %v: %q", err, body)
		}
		if m := c.Choices[0].Message; m.Content != soakAnswer(id) || m.ReasoningContent != soakReasoning(up, id) {
			return "bad", fmt.Sprintf("think tags not split: content %q reasoning %q", m.Content, m.ReasoningContent)
		}
		return "json_ok", ""
	}

	rest, err := soakStripKeepalives(body)
	if err != nil {
		return "bad", err.Error()
	}
	complete := rerr == nil
	code := ""
	if !complete {
		before, c, err := faultSplitErrorEvent(rest)
		if err != nil {
			return "bad", fmt.Sprintf("stream aborted (%v) without a final error event: %v", rerr, err)
		}
		rest, code = before, c
	} else if strings.Contains(rest, `data: {"error"`) {
		return "bad", fmt.Sprintf("error event in a stream that ended cleanly: %q", tail(rest, 300))
	}
	if think {
		if err := soakCheckThink(rest, up, id, complete); err != nil {
			return "bad", err.Error()
		}
	} else if want := strings.Join(soakEvents(up, id, false, resp.Header.Get("X-Soak-Fault") == "junk", nil, ""), ""); complete && rest != want ||
		!complete && !strings.HasPrefix(want, rest) && !strings.HasPrefix(want, strings.TrimSuffix(rest, "\n\n")) {
		// Not the first upstream's bytes: only a continued stream may differ.
		if !resume {
			if complete {
				return "bad", fmt.Sprintf("stream differs from the upstream's:\n got %q\nwant %q", rest, want)
			}
			return "bad", fmt.Sprintf("stream before the error event is not the upstream's: %q", tail(rest, 300))
		}
		if err := soakCheckResumed(rest, id, complete); err != nil {
			return "bad", err.Error()
		}
		if complete {
			return "stream_resumed", ""
		}
		return "stream_error_resumed:" + code, ""
	}
	if complete {
		return "stream_ok", ""
	}
	return "stream_error:" + code, ""
}

// soakCheckResumed checks a stream that is not byte for byte one
// upstream's, of a model with resume on: it must read as one answer to
// request id. Every event is a chat chunk with one choice 0 (or a comment,
// or [DONE]); all chunks carry one identity (id, created, model) that an
// upstream of the soak gives this request (the first upstream's whenever
// it sent a chunk, as it sends the first); one role chunk, first; a
// finish_reason only on the last chunk. A complete stream has the role
// chunk, text equal to the answer, a final "stop" and one [DONE] last;
// one cut by an error event has a prefix of the answer and no [DONE]. Any
// mix (text twice, a piece lost, PREFILL-MISMATCH) fails the text check.
func soakCheckResumed(rest string, id int64, complete bool) error {
	var text strings.Builder
	ident, chunks, roles, finished, done := "", 0, 0, false, false
	for _, ev := range strings.Split(strings.TrimSuffix(rest, "\n\n"), "\n\n") {
		switch {
		case ev == "" && rest == "":
			continue
		case done:
			return fmt.Errorf("continued stream: event after [DONE]: %q", ev)
		case strings.HasPrefix(ev, ":"):
			continue
		case ev == "data: [DONE]":
			done = true
			continue
		}
		payload, ok := strings.CutPrefix(ev, "data: ")
		var ch struct {
			ID      string          `json:"id"`
			Created json.RawMessage `json:"created"`
			Model   string          `json:"model"`
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if !ok || strings.Contains(payload, "\n") || json.Unmarshal([]byte(payload), &ch) != nil {
			return fmt.Errorf("continued stream: event is not one JSON chunk: %q", ev)
		}
		if who := ch.ID + " " + string(ch.Created) + " " + ch.Model; ident == "" {
			ident = who
			if ch.ID != soakChunkID(ch.Model, id) || string(ch.Created) != strconv.Itoa(soakCreated(ch.Model)) {
				return fmt.Errorf("continued stream: identity %q is no upstream's for request %d", who, id)
			}
		} else if who != ident {
			return fmt.Errorf("continued stream: identity changed from %q to %q", ident, who)
		}
		if finished {
			return fmt.Errorf("continued stream: chunk after the finish_reason: %q", ev)
		}
		if len(ch.Choices) != 1 || ch.Choices[0].Index != 0 {
			return fmt.Errorf("continued stream: chunk without exactly choice 0: %q", ev)
		}
		c := ch.Choices[0]
		if c.Delta.Role != "" {
			roles++
			if roles > 1 || chunks > 0 {
				return fmt.Errorf("continued stream: a second or late role chunk: %q", ev)
			}
		}
		text.WriteString(c.Delta.Content)
		if c.FinishReason != nil {
			if *c.FinishReason != "stop" {
				return fmt.Errorf("continued stream: finish_reason %q", *c.FinishReason)
			}
			finished = true
		}
		chunks++
	}
	full := soakAnswer(id)
	if !complete {
		if done {
			return fmt.Errorf("continued stream: [DONE] before the error event")
		}
		if !strings.HasPrefix(full, text.String()) {
			return fmt.Errorf("continued stream cut: text %q is not a prefix of %q (a mix)", text.String(), full)
		}
		return nil
	}
	switch {
	case !done:
		return fmt.Errorf("continued stream: no [DONE]")
	case roles != 1:
		return fmt.Errorf("continued stream: no role chunk")
	case !finished:
		return fmt.Errorf("continued stream: no final finish_reason")
	case text.String() != full:
		return fmt.Errorf("continued stream: text\n got %q\nwant %q (a mix or a loss)", text.String(), full)
	}
	return nil
}

// soakStripKeepalives is faultStripKeepalives without a testing.TB.
func soakStripKeepalives(body string) (string, error) {
	var out strings.Builder
	rest := body
	for {
		i := strings.Index(rest, faultKeepalive)
		if i < 0 {
			out.WriteString(rest)
			return out.String(), nil
		}
		if out.Len()+i > 0 && !strings.HasSuffix(out.String()+rest[:i], "\n\n") {
			return "", fmt.Errorf("heartbeat inside an event: %q", tail(out.String()+rest[:i+len(faultKeepalive)], 200))
		}
		out.WriteString(rest[:i])
		rest = rest[i+len(faultKeepalive):]
	}
}

// soakCheckThink checks a split stream: every event is a JSON chunk, the
// junk line, a comment or [DONE]; the content and reasoning add up to the
// upstream's (a prefix of them when the stream broke off).
func soakCheckThink(rest, up string, id int64, complete bool) error {
	var content, reasoning strings.Builder
	done := false
	for _, ev := range strings.Split(strings.TrimSuffix(rest, "\n\n"), "\n\n") {
		if ev == "" && rest == "" {
			continue
		}
		if done {
			return fmt.Errorf("event after [DONE]: %q", ev)
		}
		switch {
		case strings.HasPrefix(ev, ":"):
			continue
		case ev == "data: [DONE]":
			done = true
			continue
		case ev == "data: {soak-junk not json":
			continue
		}
		payload, ok := strings.CutPrefix(ev, "data: ")
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if !ok || json.Unmarshal([]byte(payload), &chunk) != nil {
			return fmt.Errorf("split stream event is not a JSON chunk: %q", ev)
		}
		for _, c := range chunk.Choices {
			content.WriteString(c.Delta.Content)
			reasoning.WriteString(c.Delta.ReasoningContent)
		}
	}
	wantC, wantR := soakAnswer(id), soakReasoning(up, id)
	if complete {
		if !done || content.String() != wantC || reasoning.String() != wantR {
			return fmt.Errorf("split stream: done %v content %q reasoning %q, want %q / %q", done, content.String(), reasoning.String(), wantC, wantR)
		}
		return nil
	}
	if !strings.HasPrefix(wantC, content.String()) || !strings.HasPrefix(wantR, reasoning.String()) {
		return fmt.Errorf("broken split stream: content %q reasoning %q are not prefixes of %q / %q", content.String(), reasoning.String(), wantC, wantR)
	}
	return nil
}

// hasNullParam reports an OpenAI error object with "param": null.
func hasNullParam(e map[string]any) bool {
	v, ok := e["param"]
	return ok && v == nil
}
