package main

// The fleet scenario (issue #24): simulated inference servers with a
// prefix KV cache (integration/kvsim) in one pool behind llm_route, driven
// by a replay of coding-agent sessions, once per placement policy and once
// for the oracle. It measures what each policy leaves in the caches and
// what that costs in time to first token; see README.md "Fleet scenario".

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/llm-route/caddy-llm-route/integration/kvsim"
)

// fleetParams is the simulated fleet and the replay.
type fleetParams struct {
	servers, slots  int
	cacheTokens     int
	prefill, decode time.Duration // per token
	output          int           // tokens per answer
	sessions, turns int
	sysTokens       int    // the shared system prompt
	firstUser       [2]int // tokens of a session's first user message, min–max
	toolResult      [2]int // tokens of the tool result each turn appends, min–max
	think           [2]time.Duration
	startSpread     time.Duration // sessions start at random within this
	affinityWait    time.Duration
	seed            uint64
}

func defaultFleet(c *config) fleetParams {
	p := fleetParams{
		servers: 3, slots: 2,
		cacheTokens: 128_000,
		prefill:     40 * time.Microsecond, decode: 3 * time.Millisecond, output: 32,
		sessions: 12, turns: 8,
		sysTokens: 3000, firstUser: [2]int{1000, 4000}, toolResult: [2]int{2000, 3500},
		think:        [2]time.Duration{time.Second, 3 * time.Second},
		startSpread:  2 * time.Second,
		affinityWait: time.Second,
		seed:         24,
	}
	if c.quick {
		p.sessions, p.turns = 6, 4
	}
	if c.fleetSlots > 0 {
		p.slots = c.fleetSlots
	}
	if c.fleetSeed != 0 {
		p.seed = c.fleetSeed
	}
	return p
}

// fleetModel is the client's model name; fleetSessionHeader the session
// header of the "+ session header" row (Claude Code's).
const (
	fleetModel         = "agent"
	fleetSessionHeader = "X-Claude-Code-Session-Id"
)

// replay is every request of every session, built once from the seed so
// each policy sees the same bytes at the same offsets.
type replay struct {
	start  []time.Duration   // per session
	bodies [][][]byte        // [session][turn]
	think  [][]time.Duration // [session][turn]: after that turn's answer
	answer string            // every answer's content (kvsim's)
}

// words is the vocabulary of the generated text (code-ish and prose-ish).
var words = strings.Fields(`func return err nil if else for range the a of to in is that this value
	config handler request upstream model token cache slot pool member session stream chunk error test
	package import struct type string int bool map slice byte buffer write read close open file path line`)

// text is about n tokens (4 bytes each) of words drawn from r.
func text(r *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n*kvsim.TokenBytes {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()
}

func uniform(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

func uniformDur(r *rand.Rand, d [2]time.Duration) time.Duration {
	return d[0] + time.Duration(r.Int64N(int64(d[1]-d[0])+1))
}

// newReplay builds the sessions: the shared system prompt, the session's
// first user message, then per turn the answer (with a tool call) and the
// tool's result appended: the history grows each turn.
func newReplay(p fleetParams) *replay {
	r := rand.New(rand.NewPCG(p.seed, 1))
	sys := "You are a coding agent. " + text(r, p.sysTokens)
	rp := &replay{answer: strings.Repeat("tok ", p.output)}
	for s := 0; s < p.sessions; s++ {
		rp.start = append(rp.start, time.Duration(r.Int64N(int64(p.startSpread)+1)))
		msgs := []map[string]any{
			{"role": "system", "content": sys},
			{"role": "user", "content": fmt.Sprintf("Task %d: ", s) + text(r, uniform(r, p.firstUser[0], p.firstUser[1]))},
		}
		var bodies [][]byte
		var thinks []time.Duration
		for t := 0; t < p.turns; t++ {
			b, _ := json.Marshal(map[string]any{
				"model": fleetModel, "messages": msgs, "stream": true,
				"stream_options": map[string]any{"include_usage": true},
			})
			bodies = append(bodies, b)
			thinks = append(thinks, uniformDur(r, p.think))
			id := fmt.Sprintf("call_%d_%d", s, t)
			msgs = append(msgs,
				map[string]any{"role": "assistant", "content": rp.answer, "tool_calls": []any{map[string]any{
					"id": id, "type": "function",
					"function": map[string]any{"name": "read_file", "arguments": fmt.Sprintf(`{"path":"src/s%d/f%d.go"}`, s, t)},
				}}},
				map[string]any{"role": "tool", "tool_call_id": id, "content": text(r, uniform(r, p.toolResult[0], p.toolResult[1]))},
			)
		}
		rp.bodies = append(rp.bodies, bodies)
		rp.think = append(rp.think, thinks)
	}
	return rp
}

// fleetRow is one policy's (or the oracle's) measurement.
type fleetRow struct {
	name             string
	prompt, cached   int // tokens over all turns (the servers' counts)
	ttft             []time.Duration
	makespan         time.Duration
	sameMember, next int            // later turns on the previous turn's member / later turns
	reasons          map[string]int // X-LLM-Route-Placement reasons
	reportedCached   int            // cached tokens the clients read in the streams' usage
	errors           int
	errKinds         map[string]int
	evictions        int
}

func (f fleetRow) ratio() float64 {
	if f.prompt == 0 {
		return 0
	}
	return float64(f.cached) / float64(f.prompt)
}

// fleetResult is the whole scenario.
type fleetResult struct {
	p    fleetParams
	rows []fleetRow
}

func (fr *fleetResult) row(name string) (fleetRow, bool) {
	for _, r := range fr.rows {
		if r.name == name {
			return r, true
		}
	}
	return fleetRow{}, false
}

// fleetRuns are the rows in run order: a policy and whether the sessions
// send a session header. The oracle comes last.
var fleetRuns = []struct {
	name, policy string
	header       bool
}{
	{"first", "first", false},
	{"least_busy", "least_busy", false},
	{"sticky", "sticky", false},
	{"sticky + session header", "sticky", true},
	{"cache_aware", "cache_aware", false},
	{"cache_aware + session header", "cache_aware", true},
}

// runFleet runs every row and returns the result; an error means the
// scenario itself could not run.
func runFleet(c *config, outDir string) (*fleetResult, error) {
	p := defaultFleet(c)
	rp := newReplay(p)
	fr := &fleetResult{p: p}
	for _, run := range fleetRuns {
		row, err := fleetPolicy(c, outDir, p, rp, run.name, run.policy, run.header)
		if err != nil {
			return nil, fmt.Errorf("fleet %s: %v", run.name, err)
		}
		fmt.Fprintf(os.Stderr, "fleet %s\n", row.oneLine())
		fr.rows = append(fr.rows, row)
	}
	row, err := fleetOracle(p, rp)
	if err != nil {
		return nil, fmt.Errorf("fleet oracle: %v", err)
	}
	fmt.Fprintf(os.Stderr, "fleet %s\n", row.oneLine())
	fr.rows = append(fr.rows, row)
	return fr, nil
}

func (f fleetRow) oneLine() string {
	return fmt.Sprintf("%-30s cached %.3f  TTFT p50 %6.0f ms p90 %6.0f ms  makespan %5.1f s  same member %d/%d  errors %d",
		f.name, f.ratio(), msP(f.ttft, 0.5), msP(f.ttft, 0.9), f.makespan.Seconds(), f.sameMember, f.next, f.errors)
}

// startServers starts n kvsim servers and warms each with the shared
// system prompt (a fleet that has served this agent before), then clears
// their records.
func startServers(p fleetParams, n, cacheTokens int, rp *replay) ([]*kvsim.Server, error) {
	var ss []*kvsim.Server
	var sys []byte
	{
		var b struct {
			Messages []any `json:"messages"`
		}
		_ = json.Unmarshal(rp.bodies[0][0], &b)
		sys, _ = json.Marshal(map[string]any{"model": "warm", "messages": b.Messages[:1], "max_tokens": 1})
	}
	for i := 0; i < n; i++ {
		s, err := kvsim.Listen(kvsim.Config{
			Slots: p.slots, CacheTokens: cacheTokens, PrefillPerToken: p.prefill, DecodePerToken: p.decode,
			OutputTokens: p.output, Engine: kvsim.LlamaCpp, Model: "local",
		})
		if err != nil {
			closeAll(ss)
			return nil, err
		}
		ss = append(ss, s)
		resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json", bytes.NewReader(sys))
		if err != nil {
			closeAll(ss)
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		s.Reset()
	}
	return ss, nil
}

func closeAll(ss []*kvsim.Server) {
	for _, s := range ss {
		s.Close()
	}
}

// fleetHandler is llm_route with one pool of the servers: max_concurrency
// = the servers' slots (what a user sets for llama.cpp --parallel), and a
// model queue so a request waits in the router, not in an engine's queue
// it cannot see.
func fleetHandler(ss []*kvsim.Server, p fleetParams, policy string) map[string]any {
	var provs, ups []any
	var ids []string
	for i, s := range ss {
		id := fmt.Sprintf("gpu%d", i)
		provs = append(provs, map[string]any{"id": "p" + id, "url": s.URL + "/v1", "forward_headers": []string{kvsim.ConvHeader}})
		ups = append(ups, map[string]any{"id": id, "provider": "p" + id, "model": "local", "max_concurrency": p.slots})
		ids = append(ids, id)
	}
	pool := map[string]any{"id": "gpus", "upstreams": ids, "placement": policy}
	if policy == "cache_aware" {
		pool["affinity_wait"] = p.affinityWait.String()
	}
	return map[string]any{
		"handler":   "llm_route",
		"providers": provs,
		"upstreams": ups,
		"pools":     []any{pool},
		"models": []any{map[string]any{"name": fleetModel, "upstreams": []string{"gpus"},
			"queue_size": 4 * p.sessions, "queue_timeout": "2m"}},
	}
}

// fleetPolicy runs the replay through a fresh Caddy with a fresh fleet.
func fleetPolicy(c *config, outDir string, p fleetParams, rp *replay, name, policy string, header bool) (fleetRow, error) {
	ss, err := startServers(p, p.servers, p.cacheTokens, rp)
	if err != nil {
		return fleetRow{}, err
	}
	defer closeAll(ss)
	file := "fleet-" + strings.NewReplacer(" ", "", "+", "-").Replace(name)
	proc, err := startProxy(c.caddyBin, outDir, kindLLM, file, c.proxyCPU, fleetHandler(ss, p, policy))
	if err != nil {
		return fleetRow{}, err
	}
	defer proc.stop()
	members := map[string]int{}
	for i := range ss {
		members[fmt.Sprintf("gpu%d", i)] = i
	}
	row := drive(rp, name, func(s int) (string, func(*http.Request)) {
		return proc.url + "/v1/chat/completions", func(r *http.Request) {
			if header {
				r.Header.Set(fleetSessionHeader, fmt.Sprintf("session-%d", s))
			}
		}
	}, func(h http.Header) int {
		if m, ok := members[h.Get("X-LLM-Route-Upstream")]; ok {
			return m
		}
		return -1
	})
	tally(&row, ss)
	return row, nil
}

// fleetOracle replays each session on a server of its own with an
// unlimited cache, straight (no router): every turn finds its previous
// prompt cached and never waits for another session.
func fleetOracle(p fleetParams, rp *replay) (fleetRow, error) {
	ss, err := startServers(p, p.sessions, 0, rp)
	if err != nil {
		return fleetRow{}, err
	}
	defer closeAll(ss)
	row := drive(rp, "oracle", func(s int) (string, func(*http.Request)) {
		return ss[s].URL + "/v1/chat/completions", func(*http.Request) {}
	}, nil)
	tally(&row, ss)
	return row, nil
}

// tally adds the servers' counts to the row.
func tally(row *fleetRow, ss []*kvsim.Server) {
	for _, s := range ss {
		st := s.Stats()
		row.prompt += st.PromptTok
		row.cached += st.CachedTok
		row.evictions += st.Evictions
	}
}

// drive plays the sessions concurrently: each waits for its start, then
// sends its turns one after the other, thinking between them. target
// gives a session's URL and header setter; member reads which member
// served an answer (nil: the session's own server).
func drive(rp *replay, name string, target func(s int) (string, func(*http.Request)), member func(http.Header) int) fleetRow {
	row := fleetRow{name: name, reasons: map[string]int{}, errKinds: map[string]int{}}
	client := &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: len(rp.bodies), DisableCompression: true,
	}, Timeout: 5 * time.Minute}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	var last time.Time
	for s := range rp.bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(rp.start[s])
			url, set := target(s)
			prev := -1
			for t, body := range rp.bodies[s] {
				tr := fleetTurn(client, url, set, body, rp.answer, s, t)
				m := s
				if member != nil {
					m = member(tr.header)
				}
				mu.Lock()
				if tr.err != nil {
					row.errors++
					row.errKinds[tr.err.Error()]++
				} else {
					row.ttft = append(row.ttft, tr.ttft)
					row.reportedCached += tr.cached
					if t > 0 {
						row.next++
						if m == prev && m >= 0 {
							row.sameMember++
						}
					}
					if reason := tr.header.Get("X-LLM-Route-Placement"); reason != "" {
						row.reasons[placementReason(reason)]++
					}
				}
				if tr.end.After(last) {
					last = tr.end
				}
				mu.Unlock()
				prev = m
				if t < len(rp.bodies[s])-1 {
					time.Sleep(rp.think[s][t])
				}
			}
		}()
	}
	wg.Wait()
	row.makespan = last.Sub(t0)
	sort.Slice(row.ttft, func(i, j int) bool { return row.ttft[i] < row.ttft[j] })
	return row
}

// placementReason is the reason word of an X-LLM-Route-Placement value
// ("cache_aware warm 0.93" → "warm").
func placementReason(v string) string {
	f := strings.Fields(v)
	if len(f) >= 2 {
		return f[1]
	}
	return v
}

type turnResult struct {
	header http.Header
	ttft   time.Duration
	end    time.Time
	cached int
	err    error
}

// fleetTurn sends one turn and reads its stream: TTFT is the first
// complete SSE event; the answer must reassemble to the expected content
// and end with [DONE].
func fleetTurn(client *http.Client, url string, set func(*http.Request), body []byte, want string, s, t int) (tr turnResult) {
	start := time.Now()
	defer func() { tr.end = time.Now() }()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(kvsim.ConvHeader, fmt.Sprintf("s%d", s))
	set(req)
	resp, err := client.Do(req)
	if err != nil {
		tr.err = errors.New(errKind(err))
		return tr
	}
	defer resp.Body.Close()
	tr.header = resp.Header
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		tr.err = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		return tr
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var content strings.Builder
	done := false
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if err != nil && err != io.EOF {
			tr.err = errors.New(errKind(err))
			return tr
		}
		line = strings.TrimRight(line, "\r\n")
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if tr.ttft == 0 {
			tr.ttft = time.Since(start)
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			tr.err = fmt.Errorf("bad chunk: %v", err)
			return tr
		}
		for _, c := range ch.Choices {
			content.WriteString(c.Delta.Content)
		}
		if ch.Usage != nil {
			tr.cached = ch.Usage.Details.Cached
		}
	}
	switch {
	case !done:
		tr.err = fmt.Errorf("stream without [DONE]")
	case content.String() != want:
		tr.err = fmt.Errorf("answer content differs (%d bytes, want %d)", content.Len(), len(want))
	}
	return tr
}

// fleetBudgets are the scenario's verdicts: cache_aware (no session
// header) against the oracle's cached ratio and least_busy's TTFT p90 and
// makespan.
func (fr *fleetResult) budgets() []budget {
	ca, ok1 := fr.row("cache_aware")
	lb, ok2 := fr.row("least_busy")
	or, ok3 := fr.row("oracle")
	b1 := budget{name: "fleet: cache_aware cached ratio ÷ oracle's", limit: "≥ 0.9"}
	b2 := budget{name: "fleet: cache_aware TTFT p90 ÷ least_busy's", limit: "≤ 0.25"}
	b3 := budget{name: "fleet: cache_aware makespan ÷ least_busy's", limit: "≤ 1"}
	if ok1 && ok3 && or.ratio() > 0 {
		v := ca.ratio() / or.ratio()
		b1.measured, b1.known, b1.pass = fmt.Sprintf("%.3f (%.3f ÷ %.3f)", v, ca.ratio(), or.ratio()), true, v >= 0.9
	}
	if ok1 && ok2 {
		p, q := msP(ca.ttft, 0.9), msP(lb.ttft, 0.9)
		b2.measured, b2.known, b2.pass = fmt.Sprintf("%.3f (%.0f ms ÷ %.0f ms)", p/q, p, q), true, p <= 0.25*q
		m, n := ca.makespan.Seconds(), lb.makespan.Seconds()
		b3.measured, b3.known, b3.pass = fmt.Sprintf("%.3f (%.1f s ÷ %.1f s)", m/n, m, n), true, m <= n
	}
	return []budget{b1, b2, b3}
}

func (fr *fleetResult) errors() int {
	n := 0
	for _, r := range fr.rows {
		n += r.errors
	}
	return n
}

// render writes the report's fleet section.
func (fr *fleetResult) render(w func(string, ...any)) {
	p := fr.p
	w("\n## Fleet scenario (cache-aware placement, issue #24)\n\n")
	w("%d simulated llama.cpp servers (integration/kvsim), %d slot(s) each, KV cache %d tokens each; prefill %v/token, decode %v/token, %d output tokens. "+
		"%d sessions × %d turns (seed %d): shared system prompt %d tokens, first user message %d–%d tokens, tool result %d–%d tokens a turn, think %v–%v, starts within %v. "+
		"Pool `gpus` of the servers (max_concurrency %d each, model queue); cache_aware with affinity_wait %v. "+
		"Oracle: each session on a server of its own with an unlimited cache, no router.\n\n",
		p.servers, p.slots, p.cacheTokens, p.prefill, p.decode, p.output,
		p.sessions, p.turns, p.seed, p.sysTokens, p.firstUser[0], p.firstUser[1], p.toolResult[0], p.toolResult[1], p.think[0], p.think[1], p.startSpread,
		p.slots, p.affinityWait)
	w("| policy | cached ratio | TTFT p50 ms | TTFT p90 ms | TTFT max ms | makespan s | later turns on the previous member | evictions | placement reasons | errors |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, r := range fr.rows {
		var rs []string
		for k, v := range r.reasons {
			rs = append(rs, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(rs)
		reasons := strings.Join(rs, ", ")
		if reasons == "" {
			reasons = "–"
		}
		w("| %s | %.3f | %.0f | %.0f | %.0f | %.1f | %d/%d | %d | %s | %d |\n", r.name, r.ratio(),
			msP(r.ttft, 0.5), msP(r.ttft, 0.9), msP(r.ttft, 1), r.makespan.Seconds(), r.sameMember, r.next, r.evictions, reasons, r.errors)
	}
	for _, r := range fr.rows {
		if r.reportedCached != r.cached && r.errors == 0 {
			w("\nNote: %s: the streams' usage reported %d cached tokens, the servers counted %d.\n", r.name, r.reportedCached, r.cached)
		}
		for k, n := range r.errKinds {
			w("\n%s: %d × %s\n", r.name, n, k)
		}
	}
	w("\n| budget | measured | limit | verdict |\n|---|---|---|---|\n")
	for _, b := range fr.budgets() {
		w("| %s | %s | %s | %s |\n", b.name, b.measured, b.limit, b.verdict())
	}
}

// writeFleetOnly is the report of a run that ran only the fleet scenario.
func writeFleetOnly(env runEnv, fr *fleetResult, outDir string) (string, error) {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# llm_route load benchmark\n\n%s · %s · fleet scenario only\n", env.start.Format("2006-01-02 15:04 MST"), env.goVersion)
	pin := fmt.Sprintf("Caddy on CPUs %s; simulated servers + replay on CPUs %s", env.cfg.proxyCPU, cpusAllowed("self"))
	if env.cfg.proxyCPU == "" {
		pin = "**no CPU pinning**"
	}
	w("\n- Pinning: %s.", pin)
	w("\n- Load average (1 min) at start %s, at end %s.", env.loadStart, env.loadEnd)
	if env.cfg.machineNote != "" {
		w(" %s.", env.cfg.machineNote)
	}
	w("\n")
	fr.render(w)
	report := b.String()
	return report, os.WriteFile(filepath.Join(outDir, "report.md"), []byte(report), 0o644)
}
