package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// results collects every measured run: per scenario, per target, per round.
type results struct {
	scs           []scenario
	rounds        int
	runs          []map[string][]runResult // [scenario][kind, or kindBaseName][round]
	peakRSSKB     map[string]int64
	profileErrors int64
	noscript      map[string]bool // redis commands a script cannot run (redis.go)
}

func newResults(scs []scenario, rounds int) *results {
	r := &results{scs: scs, rounds: rounds, peakRSSKB: map[string]int64{}}
	for range scs {
		r.runs = append(r.runs, map[string][]runResult{
			kindLLM:   make([]runResult, rounds),
			kindPlain: make([]runResult, rounds),
		})
	}
	return r
}

func (r *results) add(sc int, kind string, round int, res runResult) {
	if r.runs[sc][kind] == nil { // the baseline, in the scenarios it runs
		r.runs[sc][kind] = make([]runResult, r.rounds)
	}
	r.runs[sc][kind][round] = res
}

// kindsOf are the targets that ran scenario sc, in report order.
func (r *results) kindsOf(sc int) []string {
	if r.runs[sc][kindBaseName] != nil {
		return []string{kindLLM, kindPlain, kindBaseName}
	}
	return []string{kindLLM, kindPlain}
}

func (r *results) totalErrors() int64 {
	n := r.profileErrors
	for _, m := range r.runs {
		for _, rs := range m {
			for _, x := range rs {
				n += x.errors
			}
		}
	}
	return n
}

// runEnv describes the run for the report header.
type runEnv struct {
	start                        time.Time
	cfg                          *config
	goVersion                    string
	selfCPUs, llmCPUs, plainCPUs string
	baseCPUs                     string // with -baseline only
	redisCPUs, redisVersion      string // the redis scenarios only
	loadStart, loadEnd           string
	reqBytes, respBytes          int
}

// Per-run metrics.

func (x runResult) rps() float64 { return float64(x.requests) / x.wall.Seconds() }

func (x runResult) cpuPerReq() float64 { // ms
	if x.requests == 0 {
		return math.NaN()
	}
	return ms(x.proxyCPU) / float64(x.requests)
}

// stateCPUPerReq is redis-server's CPU per request in ms (redis scenarios).
func (x runResult) stateCPUPerReq() float64 {
	if x.requests == 0 {
		return math.NaN()
	}
	return ms(x.stateCPU) / float64(x.requests)
}

// totalCPUPerReq is Caddy's and redis-server's CPU per request in ms.
func (x runResult) totalCPUPerReq() float64 {
	if x.requests == 0 {
		return math.NaN()
	}
	return ms(x.proxyCPU+x.stateCPU) / float64(x.requests)
}

func (x runResult) stateUtil() float64 { return 100 * x.stateCPU.Seconds() / x.wall.Seconds() }

func (x runResult) proxyUtil() float64 { return 100 * x.proxyCPU.Seconds() / x.wall.Seconds() }
func (x runResult) selfUtil() float64  { return 100 * x.selfCPU.Seconds() / x.wall.Seconds() }

func (x runResult) connsPer1k() float64 {
	if x.requests == 0 {
		return math.NaN()
	}
	return 1000 * float64(x.upConns) / float64(x.requests)
}

func (x runResult) latP(q float64) float64  { return msP(x.lat, q) }
func (x runResult) ttfeP(q float64) float64 { return msP(x.ttfe, q) }

// msP is the q-quantile of d in ms, NaN when there is no sample.
func msP(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	return ms(percentile(d, q))
}

func (x runResult) oneLine() string {
	s := fmt.Sprintf("%8.0f req/s  p50 %6.2f ms  p99 %6.2f ms", x.rps(), x.latP(0.5), x.latP(0.99))
	if len(x.ttfe) > 0 {
		s += fmt.Sprintf("  ttfe %6.2f ms", x.ttfeP(0.5))
	}
	s += fmt.Sprintf("  cpu %.3f ms/req  proxy %3.0f%%  gen %3.0f%%  upconns %d  max %.0f ms  errors %d",
		x.cpuPerReq(), x.proxyUtil(), x.selfUtil(), x.upConns, ms(x.maxLat), x.errors)
	if x.stateCmds != nil {
		s += fmt.Sprintf("  redis cpu %.3f ms/req  state errors %.0f  on redis %v", x.stateCPUPerReq(), x.stateErrs, x.onRedis)
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile sorts d in place and returns its q-quantile (nearest rank).
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	if !sort.SliceIsSorted(d, func(i, j int) bool { return d[i] < d[j] }) {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	}
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func median(v []float64) float64 {
	var s []float64
	for _, x := range v {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return math.NaN()
	}
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minMax(v []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range v {
		if !math.IsNaN(x) {
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
	}
	return lo, hi
}

// paired returns f(llm_route run)/f(reverse_proxy run) per round.
func (r *results) paired(sc int, f func(runResult) float64) []float64 {
	return r.pairedOf(sc, kindLLM, kindPlain, f)
}

// pairedOf returns f(run of a)/f(run of b) per round.
func (r *results) pairedOf(sc int, a, b string, f func(runResult) float64) []float64 {
	out := make([]float64, r.rounds)
	for i := range out {
		out[i] = f(r.runs[sc][a][i]) / f(r.runs[sc][b][i])
	}
	return out
}

// pairedDiff returns f(llm_route) − f(reverse_proxy) per round.
func (r *results) pairedDiff(sc int, f func(runResult) float64) []float64 {
	out := make([]float64, r.rounds)
	for i := range out {
		out[i] = f(r.runs[sc][kindLLM][i]) - f(r.runs[sc][kindPlain][i])
	}
	return out
}

// crossRatio returns f(llm_route in scenario a)/f(llm_route in scenario b)
// per round, nil when either did not run.
func (r *results) crossRatio(a, b string, f func(runResult) float64) []float64 {
	ai, bi := r.index(a), r.index(b)
	if ai < 0 || bi < 0 {
		return nil
	}
	v := make([]float64, r.rounds)
	for k := range v {
		v[k] = f(r.runs[ai][kindLLM][k]) / f(r.runs[bi][kindLLM][k])
	}
	return v
}

// medianOf is the median over rounds of f for one scenario and target.
func (r *results) medianOf(sc int, kind string, f func(runResult) float64) float64 {
	var v []float64
	for _, x := range r.runs[sc][kind] {
		v = append(v, f(x))
	}
	return median(v)
}

func (r *results) index(name string) int {
	for i, s := range r.scs {
		if s.name == name {
			return i
		}
	}
	return -1
}

// ratioCell renders "median [min–max]" of per-round ratios.
func ratioCell(v []float64) string {
	m := median(v)
	if math.IsNaN(m) {
		return "–"
	}
	if len(v) == 1 {
		return fmt.Sprintf("%.3f", m)
	}
	lo, hi := minMax(v)
	return fmt.Sprintf("%.3f [%.2f–%.2f]", m, lo, hi)
}

func num(f float64, prec int) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, f)
}

// budget is one verdict line.
type budget struct {
	name, measured, limit string
	pass, known           bool
}

func (b budget) verdict() string {
	switch {
	case !b.known:
		return "n/a"
	case b.pass:
		return "PASS"
	}
	return "**FAIL**"
}

// budgets evaluates issue #7's budgets from the paired ratios.
func (r *results) budgets() []budget {
	var out []budget
	cpu := func(x runResult) float64 { return x.cpuPerReq() }

	// 1. requests/s geomean of the four throughput scenarios.
	{
		b := budget{name: "req/s ratio, geomean of nonstream-16/64, stream-16/64", limit: "≥ 0.85"}
		logSum, n := 0.0, 0
		for i, s := range r.scs {
			if s.throughput {
				logSum += math.Log(median(r.paired(i, runResult.rps)))
				n++
			}
		}
		if n == 4 {
			g := math.Exp(logSum / 4)
			b.measured, b.pass, b.known = fmt.Sprintf("%.3f", g), g >= 0.85, !math.IsNaN(g)
		}
		out = append(out, b)
	}
	// 2. CPU per request, worst scenario of each class.
	for _, class := range []struct{ label, mode string }{
		{"non-stream", modeNonStream}, {"stream", modeStream}, {"paced", modePaced},
	} {
		b := budget{name: "proxy CPU/req ratio, " + class.label + " (worst of its scenarios)", limit: "≤ 1.25"}
		worst, which := math.Inf(-1), ""
		for i, s := range r.scs {
			if s.mode == class.mode && s.state == "" {
				if m := median(r.paired(i, cpu)); m > worst {
					worst, which = m, s.name
				}
			}
		}
		if which != "" && !math.IsNaN(worst) {
			b.measured, b.pass, b.known = fmt.Sprintf("%.3f (%s)", worst, which), worst <= 1.25, true
		}
		out = append(out, b)
	}
	// 3. think-split CPU/req vs passthrough stream, both llm_route.
	{
		b := budget{name: "llm_route CPU/req think-split-64 ÷ stream-64", limit: "≤ 1.6"}
		ti, si := r.index("think-split-64"), r.index("stream-64")
		if ti >= 0 && si >= 0 {
			v := make([]float64, r.rounds)
			for k := range v {
				v[k] = r.runs[ti][kindLLM][k].cpuPerReq() / r.runs[si][kindLLM][k].cpuPerReq()
			}
			m := median(v)
			b.measured, b.pass, b.known = ratioCell(v), m <= 1.6, !math.IsNaN(m)
		}
		out = append(out, b)
	}
	// 3b. The fronts: llm_route CPU/req against its chat scenario, same round.
	for _, s := range r.scs {
		if s.base == "" {
			continue
		}
		b := budget{name: fmt.Sprintf("llm_route CPU/req %s ÷ %s", s.name, s.base), limit: "≤ " + strconv.FormatFloat(s.cpuLimit, 'f', -1, 64)}
		fi, bi := r.index(s.name), r.index(s.base)
		if bi >= 0 {
			v := make([]float64, r.rounds)
			for k := range v {
				v[k] = r.runs[fi][kindLLM][k].cpuPerReq() / r.runs[bi][kindLLM][k].cpuPerReq()
			}
			m := median(v)
			b.measured, b.pass, b.known = ratioCell(v), m <= s.cpuLimit, !math.IsNaN(m)
		}
		out = append(out, b)
	}
	// 3c. The shared state: llm_route with state redis against the memory
	// llm_route, req/s in the same round.
	for _, s := range r.scs {
		if s.rpsMin == 0 {
			continue
		}
		b := budget{name: fmt.Sprintf("llm_route req/s %s ÷ %s (memory)", s.name, s.memory), limit: fmt.Sprintf("≥ %.1f", s.rpsMin)}
		if v := r.crossRatio(s.name, s.memory, runResult.rps); v != nil {
			// A round with state errors ran partly on local accounting, not
			// on Redis: it does not count (none left: no verdict).
			for k, x := range r.runs[r.index(s.name)][kindLLM] {
				if !x.onRedis {
					v[k] = math.NaN()
				}
			}
			m := median(v)
			b.measured, b.pass, b.known = ratioCell(v), m >= s.rpsMin, !math.IsNaN(m)
			if n := r.roundsOffRedis(r.index(s.name)); n > 0 {
				b.measured += fmt.Sprintf(" — %d of %d rounds left out: not on Redis throughout (state errors, local accounting)", n, r.rounds)
			}
		}
		out = append(out, b)
	}
	// 4. TTFE of the paced stream.
	{
		b := budget{name: "TTFE p50 paced-32: llm_route − reverse_proxy", limit: "≤ +0.5 ms"}
		if i := r.index("paced-32"); i >= 0 {
			d := median(r.pairedDiff(i, func(x runResult) float64 { return x.ttfeP(0.5) }))
			b.measured, b.pass, b.known = fmt.Sprintf("%+.3f ms", d), d <= 0.5, !math.IsNaN(d)
		}
		out = append(out, b)
	}
	// 5. upstream connections opened per 1000 requests at 64 connections.
	{
		b := budget{name: "llm_route upstream conns opened /1000 req at 64 conns", limit: "≈ 0 (≤ 1)"}
		var parts []string
		worst := math.NaN()
		for i, s := range r.scs {
			if s.conns != 64 {
				continue
			}
			var conns, reqs int64
			for _, x := range r.runs[i][kindLLM] {
				conns += x.upConns
				reqs += x.requests
			}
			v := 1000 * float64(conns) / float64(reqs)
			parts = append(parts, fmt.Sprintf("%s %.2f", s.name, v))
			if math.IsNaN(worst) || v > worst {
				worst = v
			}
		}
		if len(parts) > 0 {
			b.measured, b.pass, b.known = strings.Join(parts, ", "), worst <= 1, !math.IsNaN(worst)
		}
		out = append(out, b)
	}
	// 6. Peak RSS.
	{
		b := budget{name: "peak RSS (VmHWM) ratio", limit: "≤ 1.5"}
		l, p := r.peakRSSKB[kindLLM], r.peakRSSKB[kindPlain]
		if l > 0 && p > 0 {
			v := float64(l) / float64(p)
			b.measured = fmt.Sprintf("%.3f (%.1f / %.1f MiB)", v, float64(l)/1024, float64(p)/1024)
			b.pass, b.known = v <= 1.5, true
		}
		out = append(out, b)
	}
	return out
}

// renderReport renders the Markdown report: header, ratios, budgets,
// absolute numbers, errors.
func renderReport(env runEnv, r *results, profiles map[string]string) string {
	var b strings.Builder
	c := env.cfg
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	w("# llm_route load benchmark\n\n")
	order := "alternates"
	if c.baseBin != "" {
		order = "rotates"
	}
	w("%s · %s · %d rounds × (%v warm-up + %v measured) per scenario and target · order %s\n\n",
		env.start.Format("2006-01-02 15:04 MST"), env.goVersion, c.rounds, c.warmup, c.duration, order)
	cpus := fmt.Sprintf("%s (llm_route) / %s (reverse_proxy)", env.llmCPUs, env.plainCPUs)
	if c.baseBin != "" {
		cpus += fmt.Sprintf(" / %s (baseline)", env.baseCPUs)
	}
	pin := fmt.Sprintf("proxies on CPUs %s; load generator + fake upstream on CPUs %s", cpus, env.selfCPUs)
	if c.proxyCPU == "" {
		pin = "**no CPU pinning** (" + pin + ")"
	}
	w("- Pinning: %s.\n", pin)
	w("- Load average (1 min) at start %s, at end %s.", env.loadStart, env.loadEnd)
	if c.machineNote != "" {
		w(" %s.", c.machineNote)
	}
	w("\n")
	w("- Same Caddy binary for both; reverse_proxy keep_alive max_idle_conns_per_host %s.\n", idleNote(c.plainIdle))
	if c.baseBin != "" {
		w("- Baseline: the llm_route config also runs from `%s` (the previous build) in every non-redis scenario, in the same rounds; the order of the targets rotates.\n", c.baseBin)
	}
	w("- Request %d B (system prompt + 3 messages); completion %d B; streams %d data events + [DONE]; paced: %v think time, then %v between events.\n",
		env.reqBytes, env.respBytes, streamEvents, c.think, c.interval)
	w("- Ratios are llm_route ÷ reverse_proxy from the same round (median, [min–max] over rounds). Absolute numbers on a shared machine move ±30 %%; trust the ratios.\n\n")

	w("## Ratios (llm_route ÷ reverse_proxy)\n\n")
	w("| scenario | conns | req/s | p50 latency | p99 latency | TTFE p50 | proxy CPU/req | errors llm / plain |\n")
	w("|---|---:|---|---|---|---|---|---|\n")
	for i, s := range r.scs {
		ttfe := "–"
		if streams(s.mode) {
			d := median(r.pairedDiff(i, func(x runResult) float64 { return x.ttfeP(0.5) }))
			ttfe = fmt.Sprintf("%s (%+.2f ms)", ratioCell(r.paired(i, func(x runResult) float64 { return x.ttfeP(0.5) })), d)
		}
		w("| %s | %d | %s | %s | %s | %s | %s | %d / %d |\n", s.name, s.conns,
			ratioCell(r.paired(i, runResult.rps)),
			ratioCell(r.paired(i, func(x runResult) float64 { return x.latP(0.5) })),
			ratioCell(r.paired(i, func(x runResult) float64 { return x.latP(0.99) })),
			ttfe,
			ratioCell(r.paired(i, runResult.cpuPerReq)),
			sumErrors(r.runs[i][kindLLM]), sumErrors(r.runs[i][kindPlain]))
	}
	if i := r.index("think-split-64"); i >= 0 {
		w("\nthink-split-64: llm_route splits `<think>` into reasoning_content; reverse_proxy passes the same stream through, so its ratio is the price of the rewrite, not a like-for-like comparison.\n")
	}
	if slices.ContainsFunc(r.scs, func(s scenario) bool { return s.state == "redis" }) {
		w("\nredis-* scenarios: the llm_route side is the Caddy with `state redis`; its proxy CPU here is Caddy's alone (redis-server's and the sum are in \"Shared state in Redis\" below).\n")
	}
	for _, s := range r.scs {
		if isFrontMode(s.mode) {
			w("\nFront scenarios: reverse_proxy relays the client's Messages/Responses/Gemini request to the fake upstream's native endpoint (it cannot translate); in the *-translated ones llm_route turns it into a chat completion and the chat stream back into the client's events, so their ratio is the price of the translation.\n")
			break
		}
	}

	renderBaseline(w, r)

	w("\n## Budgets\n\n| budget | measured | limit | verdict |\n|---|---|---|---|\n")
	for _, bu := range r.budgets() {
		m := bu.measured
		if m == "" {
			m = "(scenario not run)"
		}
		w("| %s | %s | %s | %s |\n", bu.name, m, bu.limit, bu.verdict())
	}

	w("\n## Absolute numbers (median over rounds; indicative only)\n\n")
	w("| scenario | target | req/s | p50 ms | p99 ms | TTFE p50 ms | TTFE p99 ms | proxy CPU ms/req | proxy core %% | gen core %% | upstream conns /1k req | errors |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var genBound []string
	for i, s := range r.scs {
		for _, k := range r.kindsOf(i) {
			med := func(f func(runResult) float64) float64 { return r.medianOf(i, k, f) }
			t50, t99 := "–", "–"
			if streams(s.mode) {
				t50 = num(med(func(x runResult) float64 { return x.ttfeP(0.5) }), 2)
				t99 = num(med(func(x runResult) float64 { return x.ttfeP(0.99) }), 2)
			}
			gen := med(runResult.selfUtil)
			if gen >= 90 && med(runResult.proxyUtil) < 90 {
				genBound = append(genBound, s.name+" "+k)
			}
			w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", s.name, k,
				num(med(runResult.rps), 0),
				num(med(func(x runResult) float64 { return x.latP(0.5) }), 2),
				num(med(func(x runResult) float64 { return x.latP(0.99) }), 2),
				t50, t99,
				num(med(runResult.cpuPerReq), 4),
				num(med(runResult.proxyUtil), 0),
				num(gen, 0),
				num(med(runResult.connsPer1k), 2),
				sumErrors(r.runs[i][k]))
		}
	}
	var thin []string
	for i, s := range r.scs {
		for _, k := range r.kindsOf(i) {
			for _, x := range r.runs[i][k] {
				if x.requests < 200 {
					thin = append(thin, s.name+" "+k)
					break
				}
			}
		}
	}
	var stalls []string
	for i, s := range r.scs {
		for _, k := range r.kindsOf(i) {
			for round, x := range r.runs[i][k] {
				if x.maxLat > time.Second {
					stalls = append(stalls, fmt.Sprintf("%s %s round %d (%.1f s)", s.name, k, round+1, x.maxLat.Seconds()))
				}
			}
		}
	}
	if len(stalls) > 0 {
		w("\n**Stalls** (a response took > 1 s): %s — the machine (or the proxy) stopped; that round's numbers are suspect.\n", strings.Join(stalls, ", "))
	}
	if len(thin) > 0 {
		w("\n**Few samples** (< 200 requests in a window): %s — use a longer DURATION for numbers you quote.\n", strings.Join(thin, ", "))
	}
	w("\nPeak RSS (VmHWM, whole process lifetime): llm_route %.1f MiB, reverse_proxy %.1f MiB.\n",
		float64(r.peakRSSKB[kindLLM])/1024, float64(r.peakRSSKB[kindPlain])/1024)
	w("CPU is utime+stime from /proc/PID/stat (tick %v); core %% = CPU time ÷ wall time of the window (100 %% = one core busy).\n", clockTick)
	if len(genBound) > 0 {
		w("\n**Generator-bound** (its core ≥ 90 %% while the proxy's was < 90 %%): %s — req/s ratios there understate the proxy difference; CPU/req still holds.\n",
			strings.Join(genBound, ", "))
	}

	renderShared(w, env, r)

	if r.totalErrors() > 0 {
		w("\n## Errors\n\n| scenario | target | count | kind |\n|---|---|---:|---|\n")
		for i, s := range r.scs {
			for _, k := range r.kindsOf(i) {
				kinds := map[string]int64{}
				for _, x := range r.runs[i][k] {
					for kind, n := range x.errKinds {
						kinds[kind] += n
					}
				}
				for kind, n := range kinds {
					w("| %s | %s | %d | %s |\n", s.name, k, n, strings.ReplaceAll(kind, "|", "\\|"))
				}
			}
		}
		if r.profileErrors > 0 {
			w("\n%d errors during the profiling runs.\n", r.profileErrors)
		}
	}

	if len(profiles) > 0 {
		w("\n## CPU profiles\n\n")
		keys := make([]string, 0, len(profiles))
		for k := range profiles {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			w("- %s: `go tool pprof -top %s`\n", k, profiles[k])
		}
	}
	return b.String()
}

// renderBaseline adds, when the baseline ran, its ratios to reverse_proxy
// and llm_route's to it, per scenario and from the same round.
func renderBaseline(w func(string, ...any), r *results) {
	rss := r.peakRSSKB[kindBaseName]
	if rss == 0 {
		return
	}
	w("\n## Baseline (the previous build, same llm_route config)\n\n")
	w("Each cell: median [min–max] over rounds of the ratio measured in the same round. llm_route ÷ baseline above 1 for CPU/req (below 1 for req/s) is what the change costs.\n\n")
	w("| scenario | conns | baseline ÷ reverse_proxy req/s | baseline ÷ reverse_proxy CPU/req | llm_route ÷ baseline req/s | llm_route ÷ baseline CPU/req |\n")
	w("|---|---:|---|---|---|---|\n")
	for i, s := range r.scs {
		if r.runs[i][kindBaseName] == nil {
			continue
		}
		w("| %s | %d | %s | %s | %s | %s |\n", s.name, s.conns,
			ratioCell(r.pairedOf(i, kindBaseName, kindPlain, runResult.rps)),
			ratioCell(r.pairedOf(i, kindBaseName, kindPlain, runResult.cpuPerReq)),
			ratioCell(r.pairedOf(i, kindLLM, kindBaseName, runResult.rps)),
			ratioCell(r.pairedOf(i, kindLLM, kindBaseName, runResult.cpuPerReq)))
	}
	w("\nPeak RSS (VmHWM): baseline %.1f MiB; llm_route ÷ baseline %.3f, baseline ÷ reverse_proxy %.3f.\n",
		float64(rss)/1024, float64(r.peakRSSKB[kindLLM])/float64(rss), float64(rss)/float64(r.peakRSSKB[kindPlain]))
}

func idleNote(n int) string {
	if n <= 0 {
		return "32 (Caddy default)"
	}
	return fmt.Sprintf("%d (as llm_route's transport)", n)
}

func sumErrors(rs []runResult) int64 {
	var n int64
	for _, x := range rs {
		n += x.errors
	}
	return n
}
