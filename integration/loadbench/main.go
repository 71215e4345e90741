// Command loadbench is the load benchmark of issue #7: it compares the
// llm_route handler with a plain reverse_proxy, both running in the same
// Caddy binary, against a fake OpenAI-compatible upstream, and reports paired
// ratios and budget verdicts.
//
// Run it through ./integration/loadbench/run.sh, which builds the Caddy
// binary and this program and pins the processes; see README.md.
//
// In one run it starts the fake upstream (in this process), starts two Caddy
// processes (one per handler, pinned to -proxy-cpu), checks one request of
// every scenario against both, then for every round and scenario drives both
// targets in turn (the order alternates) with a closed loop of N keep-alive
// connections: warm-up, then a measured window. Every response is validated;
// errors are reported, and make the exit status 1. Budget misses are only
// reported. The redis scenarios (redis.go) add a redis-server and a third
// Caddy, llm_route with `state redis`, which takes the llm_route side there.
// With -baseline, a Caddy built from the previous main runs the same llm_route
// config as a third target in every other scenario, so a change's CPU cost
// shows against the build before it, measured in the same rounds.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// config holds the command-line knobs.
type config struct {
	caddyBin    string
	baseBin     string
	outDir      string
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	quick       bool
	proxyCPU    string
	redisCPU    string
	scenarios   string
	profile     time.Duration
	plainIdle   int
	think       time.Duration
	interval    time.Duration
	machineNote string
	fleetSlots  int
	fleetSeed   uint64
}

func parseFlags() *config {
	c := &config{}
	flag.StringVar(&c.caddyBin, "caddy", "", "Caddy binary built with the llm_route module (required)")
	flag.StringVar(&c.baseBin, "baseline", "", "Caddy binary of the previous build: also run llm_route's config from it as a third target (empty: none)")
	flag.StringVar(&c.outDir, "out", "integration/loadbench/out", "directory for report.md, configs, logs and profiles")
	flag.DurationVar(&c.duration, "duration", 5*time.Second, "measured window per scenario, target and round")
	flag.DurationVar(&c.warmup, "warmup", time.Second, "warm-up before each measured window")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds; the order of the targets alternates (rotates with -baseline)")
	flag.BoolVar(&c.quick, "quick", false, "smoke run: -duration 1s -warmup 300ms -rounds 2 unless set explicitly")
	flag.StringVar(&c.proxyCPU, "proxy-cpu", "", "CPU list to pin the Caddy processes to with taskset (empty: no pinning)")
	flag.StringVar(&c.redisCPU, "redis-cpu", "proxy", "CPU list to pin redis-server to in the redis scenarios: proxy (the proxies' CPUs, default), none, or a list")
	flag.StringVar(&c.scenarios, "scenarios", "all", "comma-separated scenario names to run, or all")
	flag.DurationVar(&c.profile, "profile", 0, "if > 0, afterwards capture CPU profiles of this length from both proxies' /debug/pprof")
	flag.IntVar(&c.plainIdle, "plain-idle", 1024, "reverse_proxy keep_alive.max_idle_conns_per_host (llm_route uses 1024; 0 = Caddy's default 32)")
	flag.DurationVar(&c.think, "think", 50*time.Millisecond, "paced stream: delay before the first event")
	flag.DurationVar(&c.interval, "interval", 5*time.Millisecond, "paced stream: delay between events")
	flag.StringVar(&c.machineNote, "note", "", "free text for the report header (e.g. how the run was pinned)")
	flag.IntVar(&c.fleetSlots, "fleet-slots", 2, "fleet scenario: slots of each simulated server (and its max_concurrency)")
	flag.Uint64Var(&c.fleetSeed, "fleet-seed", 24, "fleet scenario: seed of the session replay")
	flag.Parse()
	if c.quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["duration"] {
			c.duration = time.Second
		}
		if !set["warmup"] {
			c.warmup = 300 * time.Millisecond
		}
		if !set["rounds"] {
			c.rounds = 2
		}
	}
	return c
}

func main() {
	c := parseFlags()
	code, err := run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

// run does the whole benchmark; the exit code is 1 when any response was
// invalid.
func run(c *config) (int, error) {
	if c.caddyBin == "" {
		return 0, fmt.Errorf("-caddy is required (run ./integration/loadbench/run.sh)")
	}
	if c.rounds < 1 || c.duration <= 0 {
		return 0, fmt.Errorf("need -rounds >= 1 and -duration > 0")
	}
	scs, fleet, err := selectRun(c.scenarios)
	if err != nil {
		return 0, err
	}
	outDir, err := filepath.Abs(c.outDir)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return 0, err
	}
	if len(scs) == 0 {
		return runFleetOnly(c, outDir)
	}

	p := newPayloads()
	up, err := startUpstream(p, c.think, c.interval)
	if err != nil {
		return 0, err
	}
	defer up.close()

	llm, err := startProxy(c.caddyBin, outDir, kindLLM, kindLLM, c.proxyCPU, llmHandler(up.url, true))
	if err != nil {
		return 0, err
	}
	defer llm.stop()
	plain, err := startProxy(c.caddyBin, outDir, kindPlain, kindPlain, c.proxyCPU, plainHandler(up.addr, c.plainIdle))
	if err != nil {
		return 0, err
	}
	defer plain.stop()
	targets := []*proxyProc{llm, plain}
	// The baseline: the same llm_route config from the previous build.
	var base *proxyProc
	if c.baseBin != "" {
		if base, err = startProxy(c.baseBin, outDir, kindLLM, kindBaseName, c.proxyCPU, llmHandler(up.url, false)); err != nil {
			return 0, err
		}
		defer base.stop()
	}

	// The redis scenarios' llm_route and redis-server, only when one runs.
	var rds *redisProc
	var llmRedis *proxyProc
	if slices.ContainsFunc(scs, func(s scenario) bool { return s.state == "redis" }) {
		if rds, err = startRedis(outDir, redisCPU(c)); err != nil {
			return 0, err
		}
		defer rds.stop()
		if llmRedis, err = startProxy(c.caddyBin, outDir, kindLLM, kindRedisName, c.proxyCPU, redisHandler(up.url, rds.addr)); err != nil {
			return 0, err
		}
		defer llmRedis.stop()
		if err := rds.waitShared(10 * time.Second); err != nil {
			return 0, fmt.Errorf("%v; see %s", err, llmRedis.log)
		}
	}
	// llmFor is the llm_route process a scenario drives; driveOf all the
	// targets it drives (the baseline in every non-redis scenario).
	llmFor := func(sc scenario) *proxyProc {
		if sc.state == "redis" {
			return llmRedis
		}
		return llm
	}
	driveOf := func(sc scenario) []*proxyProc {
		if base != nil && sc.state == "" && sc.mode != modeRouter && sc.mode != modeGuard {
			return []*proxyProc{llmFor(sc), plain, base}
		}
		return []*proxyProc{llmFor(sc), plain}
	}

	env := runEnv{
		start:     time.Now(),
		cfg:       c,
		goVersion: runtime.Version(),
		selfCPUs:  cpusAllowed("self"),
		llmCPUs:   cpusAllowed(llm.pid),
		plainCPUs: cpusAllowed(plain.pid),
		loadStart: loadAvg(),
		reqBytes:  len(p.reqNonStream),
		respBytes: len(p.completion),
	}
	fmt.Fprintf(os.Stderr, "loadbench: upstream %s, llm_route %s (pid %s, cpus %s), reverse_proxy %s (pid %s, cpus %s), generator cpus %s\n",
		up.url, llm.url, llm.pid, env.llmCPUs, plain.url, plain.pid, env.plainCPUs, env.selfCPUs)

	if base != nil {
		env.baseCPUs = cpusAllowed(base.pid)
		fmt.Fprintf(os.Stderr, "loadbench: baseline llm_route %s (pid %s, cpus %s) from %s\n", base.url, base.pid, env.baseCPUs, c.baseBin)
	}
	if rds != nil {
		env.redisCPUs, env.redisVersion = cpusAllowed(rds.pid), rds.version()
		fmt.Fprintf(os.Stderr, "loadbench: llm_route with state redis %s (pid %s), redis-server %s (pid %s, cpus %s)\n",
			llmRedis.url, llmRedis.pid, rds.addr, rds.pid, env.redisCPUs)
	}

	// Pre-flight: one valid response of every scenario from each, or stop.
	for _, sc := range scs {
		for _, t := range driveOf(sc) {
			if err := probeOnce(p, t, up, sc); err != nil {
				fmt.Fprintln(os.Stderr, "loadbench: pre-flight failed:", err)
				return 1, nil
			}
		}
	}

	results := newResults(scs, c.rounds)
	if rds != nil {
		results.noscript = rds.noscript
	}
	for r := 0; r < c.rounds; r++ {
		for i, sc := range scs {
			// The order rotates with round and scenario (with two
			// targets: alternates).
			ts := driveOf(sc)
			k := (r + i) % len(ts)
			for _, t := range append(ts[k:], ts[:k]...) {
				lr := newLoadRun(p, t, up, sc)
				var res runResult
				var err error
				if t == llmRedis {
					lr.statePID = rds.pid
					res, err = runShared(lr, rds, c.warmup, c.duration)
				} else {
					res, err = lr.run(c.warmup, c.duration)
				}
				if err != nil {
					return 0, fmt.Errorf("%s %s: %v", t.name, sc.name, err)
				}
				key := t.kind
				if t == base {
					key = t.name
				}
				results.add(i, key, r, res)
				fmt.Fprintf(os.Stderr, "round %d/%d %-15s %-18s %s\n", r+1, c.rounds, sc.name, t.name, res.oneLine())
			}
		}
	}

	profiles := map[string]string{}
	if c.profile > 0 {
		for _, t := range targets {
			for _, name := range []string{"nonstream-16", "nonstream-64", "stream-16", "stream-64", "think-split-64"} {
				sc, ok := findScenario(scs, name)
				if !ok || (t.kind == kindPlain && sc.mode == modeThink) {
					continue
				}
				path := filepath.Join(outDir, fmt.Sprintf("cpu-%s-%s.pprof", t.kind, name))
				res, err := profileRun(p, t, up, sc, c.profile, path)
				if err != nil {
					fmt.Fprintf(os.Stderr, "loadbench: profile %s %s: %v\n", t.kind, name, err)
					continue
				}
				results.profileErrors += res.errors
				profiles[t.kind+" "+name] = path
				fmt.Fprintf(os.Stderr, "profile %-15s %-13s %s -> %s\n", name, t.kind, res.oneLine(), path)
			}
			// Allocations since the process started: the whole run.
			path := filepath.Join(outDir, fmt.Sprintf("allocs-%s.pprof", t.kind))
			if err := fetchProfile(t.admin+"/debug/pprof/allocs", path, 30*time.Second); err != nil {
				fmt.Fprintf(os.Stderr, "loadbench: allocs profile %s: %v\n", t.kind, err)
				continue
			}
			profiles[t.kind+" allocations (whole run; -sample_index=alloc_space)"] = path
		}
		// The llm_route with state redis under its non-stream scenario:
		// where its extra CPU per request goes.
		if sc, ok := findScenario(scs, "redis-nonstream-64"); ok {
			path := filepath.Join(outDir, fmt.Sprintf("cpu-%s-%s.pprof", kindRedisName, sc.name))
			res, err := profileRun(p, llmRedis, up, sc, c.profile, path)
			if err != nil {
				fmt.Fprintf(os.Stderr, "loadbench: profile %s %s: %v\n", kindRedisName, sc.name, err)
			} else {
				results.profileErrors += res.errors
				profiles[kindRedisName+" "+sc.name] = path
				fmt.Fprintf(os.Stderr, "profile %-15s %-13s %s -> %s\n", sc.name, kindRedisName, res.oneLine(), path)
			}
		}
	}

	// The fleet scenario (fleet.go) runs Caddy processes of its own.
	var fr *fleetResult
	if fleet {
		if fr, err = runFleet(c, outDir); err != nil {
			return 0, err
		}
	}

	for _, t := range []*proxyProc{llm, plain, llmRedis, base} {
		if t == nil {
			continue
		}
		hwm, err := procStatusKB(t.pid, "VmHWM")
		if err != nil {
			return 0, err
		}
		results.peakRSSKB[t.name] = hwm
	}

	env.loadEnd = loadAvg()
	report := renderReport(env, results, profiles)
	if fr != nil {
		var b strings.Builder
		fr.render(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
		report += b.String()
	}
	fmt.Print(report)
	if err := os.WriteFile(filepath.Join(outDir, "report.md"), []byte(report), 0o644); err != nil {
		return 0, err
	}
	if results.totalErrors() > 0 {
		fmt.Fprintf(os.Stderr, "loadbench: %d invalid responses or request errors (see the errors column)\n", results.totalErrors())
		return 1, nil
	}
	if fr != nil && fr.errors() > 0 {
		fmt.Fprintf(os.Stderr, "loadbench: %d fleet turns failed (see the fleet section)\n", fr.errors())
		return 1, nil
	}
	return 0, nil
}

// runFleetOnly runs only the fleet scenario (SCENARIOS=fleet): no proxy
// pair, no fake upstream.
func runFleetOnly(c *config, outDir string) (int, error) {
	env := runEnv{start: time.Now(), cfg: c, goVersion: runtime.Version(), loadStart: loadAvg()}
	fr, err := runFleet(c, outDir)
	if err != nil {
		return 0, err
	}
	env.loadEnd = loadAvg()
	report, err := writeFleetOnly(env, fr, outDir)
	if err != nil {
		return 0, err
	}
	fmt.Print(report)
	if fr.errors() > 0 {
		fmt.Fprintf(os.Stderr, "loadbench: %d fleet turns failed (see the fleet section)\n", fr.errors())
		return 1, nil
	}
	return 0, nil
}

// selectRun splits the list into the throughput scenarios and whether the
// fleet scenario runs ("all" includes it).
func selectRun(list string) ([]scenario, bool, error) {
	if list == "" || list == "all" {
		return scenarios, true, nil
	}
	var rest []string
	fleet := false
	for _, name := range strings.Split(list, ",") {
		if strings.TrimSpace(name) == "fleet" {
			fleet = true
		} else {
			rest = append(rest, name)
		}
	}
	if len(rest) == 0 {
		return nil, fleet, nil
	}
	scs, err := selectScenarios(strings.Join(rest, ","))
	return scs, fleet, err
}

// redisCPU is the CPU list redis-server is pinned to: -redis-cpu, where
// "proxy" means the proxies' (none when they are not pinned either).
func redisCPU(c *config) string {
	switch c.redisCPU {
	case "proxy":
		return c.proxyCPU
	case "none", "":
		return ""
	}
	return c.redisCPU
}

// runShared is lr.run for the llm_route with state redis: it also reads
// redis-server's command counters and llm_route's state errors before the
// first request and after the last, so the commands divide by every request
// of the run (warm-up included) and nothing in flight is cut in two.
//
// A fallback to local accounting started by an earlier run lasts until the
// instance's next lease renewal (up to lease_ttl/3): it waits for that
// first, so each run starts on Redis. The run is on Redis throughout when
// it started healthy and had no state error (only an error leaves Redis).
func runShared(lr *loadRun, rds *redisProc, warmup, window time.Duration) (runResult, error) {
	healthy := waitHealthy(lr.target.admin, 15*time.Second)
	calls0, err := rds.commandCalls()
	if err != nil {
		return runResult{}, err
	}
	errs0, err := stateErrors(lr.target.admin)
	if err != nil {
		return runResult{}, err
	}
	res, err := lr.run(warmup, window)
	if err != nil {
		return res, err
	}
	calls1, err := rds.commandCalls()
	if err != nil {
		return res, err
	}
	errs1, err := stateErrors(lr.target.admin)
	if err != nil {
		return res, err
	}
	res.stateCmds = commandDelta(calls0, calls1)
	res.stateErrs = errs1 - errs0
	res.onRedis = healthy && res.stateErrs == 0
	return res, nil
}

// selectScenarios filters the scenario list by name.
func selectScenarios(list string) ([]scenario, error) {
	if list == "" || list == "all" {
		return scenarios, nil
	}
	var out []scenario
	for _, name := range strings.Split(list, ",") {
		sc, ok := findScenario(scenarios, strings.TrimSpace(name))
		if !ok {
			var names []string
			for _, s := range scenarios {
				names = append(names, s.name)
			}
			return nil, fmt.Errorf("unknown scenario %q (have %s, fleet)", name, strings.Join(names, ", "))
		}
		out = append(out, sc)
	}
	return out, nil
}

func findScenario(scs []scenario, name string) (scenario, bool) {
	for _, s := range scs {
		if s.name == name {
			return s, true
		}
	}
	return scenario{}, false
}

// profileRun drives target with sc while fetching a CPU profile of d from
// its admin endpoint into path. Its numbers are not part of the results
// (profiling costs CPU), but its errors are.
func profileRun(p *payloads, t *proxyProc, up *fakeUpstream, sc scenario, d time.Duration, path string) (runResult, error) {
	const warm = 500 * time.Millisecond
	errc := make(chan error, 1)
	go func() {
		time.Sleep(warm)
		secs := max(int(d.Round(time.Second)/time.Second), 1)
		errc <- fetchProfile(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", t.admin, secs), path, d+30*time.Second)
	}()
	lr := newLoadRun(p, t, up, sc)
	res, err := lr.run(warm, d+time.Second)
	if perr := <-errc; err == nil {
		err = perr
	}
	return res, err
}

// fetchProfile saves the pprof profile at url into path.
func fetchProfile(url, path string, timeout time.Duration) error {
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof: status %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
