package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The shared-state scenarios (issue #16): a third Caddy process runs the
// same llm_route config with `state redis` against a redis-server of the
// benchmark's own. Its CPU per request is Caddy's and redis-server's,
// reported apart and summed; its round trips per request are read from
// the server's own counters (INFO commandstats), not inferred from the code.

// kindRedisName names the third process's files (config, log); its kind
// stays kindLLM, so it is validated exactly as the memory llm_route.
const kindRedisName = "llm_route-redis"

// redisProc is the benchmark's redis-server: loopback, no persistence.
type redisProc struct {
	cmd  *exec.Cmd
	pid  string
	addr string
	log  string
	c    *redis.Client // the benchmark's own connection, for INFO
	// noscript holds the commands Redis flags `noscript`: a script cannot
	// run them, so each call of one is a client's round trip.
	noscript map[string]bool
}

// startRedis starts redis-server on a free loopback port, pinned to cpu
// when it is not empty, and waits until it answers.
func startRedis(outDir, cpu string) (*redisProc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(outDir, "redis")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(outDir, "redis-server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir}
	if cpu != "" {
		args = append([]string{"taskset", "-c", cpu}, args...) // taskset execs in place: the PID is redis-server's
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting redis-server: %v", err)
	}
	r := &redisProc{cmd: cmd, pid: strconv.Itoa(cmd.Process.Pid), addr: fmt.Sprintf("127.0.0.1:%d", port), log: logPath}
	r.c = redis.NewClient(&redis.Options{Addr: r.addr, DisableIdentity: true})
	deadline := time.Now().Add(10 * time.Second)
	for r.c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			r.stop()
			return nil, fmt.Errorf("redis-server did not answer within 10s; see %s", logPath)
		}
		time.Sleep(20 * time.Millisecond)
	}
	infos, err := r.c.Command(context.Background()).Result()
	if err != nil {
		r.stop()
		return nil, fmt.Errorf("redis COMMAND: %v", err)
	}
	r.noscript = map[string]bool{}
	for name, ci := range infos {
		if slices.Contains(ci.Flags, "noscript") {
			r.noscript[strings.ToLower(name)] = true
		}
	}
	return r, nil
}

// stop kills redis-server (nothing to save) and waits for it.
func (r *redisProc) stop() {
	_ = r.c.Close()
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
}

// commandCalls reads INFO commandstats: calls per command name (lower case,
// subcommands as "client|setinfo"). The INFO calls of the benchmark itself
// are dropped.
func (r *redisProc) commandCalls() (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := r.c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || name == "info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("INFO commandstats: bad line %q", line)
		}
		out[name] = n
	}
	// The socket reads Redis processed: one per batch of commands a
	// client sent, i.e. the real round trips once calls are pipelined.
	st, err := r.c.Info(ctx, "stats").Result()
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(st, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_reads_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("INFO stats: bad line %q", line)
			}
			out[readsKey] = n
		}
	}
	return out, nil
}

// readsKey holds total_reads_processed among the command counts.
const readsKey = "(socket reads)"

// commandDelta is after − before, per command, without the zeros.
func commandDelta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, n := range after {
		if n -= before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// redisHandler is llmHandler with the shared state in Redis at addr. The
// default timeout (50 ms) and lease TTL apply, as a user would have them.
func redisHandler(upstreamURL, addr string) map[string]any {
	h := llmHandler(upstreamURL, false)
	h["state"] = map[string]any{"backend": "redis", "address": addr, "prefix": "loadbench:"}
	return h
}

// stateErrors reads llm_proxy_state_errors_total from the admin /metrics
// of a Caddy process (Redis calls that failed or timed out: the instance
// then counts locally, so its figures stop being a Redis measurement).
func stateErrors(admin string) (float64, error) {
	body, err := getBody(admin + "/metrics")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, "llm_proxy_state_errors_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	// llm_route registers it with every config: without it the run could
	// not tell a Redis measurement from a local fallback.
	return 0, fmt.Errorf("no llm_proxy_state_errors_total in %s/metrics", admin)
}

// getBody GETs url and returns its body (status 200 only).
func getBody(url string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return string(b), nil
}

// waitShared waits until the redis llm_route has reached Redis: its first
// lease renewal (a script) runs at start-up, and until it answers the
// instance counts locally.
func (r *redisProc) waitShared(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		calls, err := r.commandCalls()
		if err == nil && calls["evalsha"]+calls["eval"] > 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("llm_route with state redis ran no script on redis-server within %v", limit)
}

// version is redis-server's redis_version, "?" when INFO fails.
func (r *redisProc) version() string {
	s, err := r.c.Info(context.Background(), "server").Result()
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}

// roundsOffRedis counts the rounds of scenario i in which the llm_route
// with state redis was not on Redis throughout (it started in the fallback
// or had a failed or timed-out Redis call).
func (r *results) roundsOffRedis(i int) int {
	n := 0
	for _, x := range r.runs[i][kindLLM] {
		if !x.onRedis {
			n++
		}
	}
	return n
}

// waitHealthy polls the admin API's GET /llm_route/status until its state
// says healthy, for at most limit; it reports whether it did.
func waitHealthy(admin string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		body, err := getBody(admin + "/llm_route/status")
		var st struct {
			State struct {
				Backend string `json:"backend"`
				Healthy bool   `json:"healthy"`
			} `json:"state"`
		}
		if err == nil && json.Unmarshal([]byte(body), &st) == nil && st.State.Backend == "redis" && st.State.Healthy {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// renderShared is the report's section on the redis scenarios: CPU of
// Caddy and of redis-server apart and summed, against the memory llm_route
// and reverse_proxy of the same run, and the commands Redis ran per request.
func renderShared(w func(string, ...any), env runEnv, r *results) {
	var shared []int
	for i, s := range r.scs {
		if s.state == "redis" {
			shared = append(shared, i)
		}
	}
	if len(shared) == 0 {
		return
	}
	w("\n## Shared state in Redis (issue #16)\n\n")
	w("A third Caddy runs the same llm_route config with `state redis` (defaults: timeout 50 ms, lease_ttl 30 s) against a redis-server %s of the benchmark's own (loopback, no persistence, CPUs %s). ",
		env.redisVersion, env.redisCPUs)
	w("CPU/req counts the requests completed in the window; redis-server's CPU is read at the same instants as Caddy's. Median over rounds.\n\n")
	w("| scenario | target | req/s | p50 ms | p99 ms | Caddy CPU ms/req | redis-server CPU ms/req | sum ms/req | Caddy core %% | redis core %% |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	row := func(name, target string, i int, kind string, redis bool) {
		med := func(f func(runResult) float64) float64 { return r.medianOf(i, kind, f) }
		rcpu, rutil := "–", "–"
		if redis {
			rcpu, rutil = num(med(runResult.stateCPUPerReq), 4), num(med(runResult.stateUtil), 0)
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, target,
			num(med(runResult.rps), 0), num(med(func(x runResult) float64 { return x.latP(0.5) }), 2),
			num(med(func(x runResult) float64 { return x.latP(0.99) }), 2),
			num(med(runResult.cpuPerReq), 4), rcpu, num(med(runResult.totalCPUPerReq), 4),
			num(med(runResult.proxyUtil), 0), rutil)
	}
	for _, i := range shared {
		s := r.scs[i]
		if mi := r.index(s.memory); mi >= 0 {
			row(s.memory, "llm_route, state memory", mi, kindLLM, false)
		}
		row(s.name, "llm_route, state redis", i, kindLLM, true)
		row(s.name, "reverse_proxy", i, kindPlain, false)
	}

	w("\nRatios, same round (median [min–max]); \"CPU\" is Caddy + redis-server for the redis target:\n\n")
	w("| scenario | req/s ÷ memory | CPU/req ÷ memory | req/s ÷ reverse_proxy | CPU/req ÷ reverse_proxy |\n|---|---|---|---|---|\n")
	for _, i := range shared {
		s := r.scs[i]
		vsMem := func(f func(runResult) float64) string {
			if v := r.crossRatio(s.name, s.memory, f); v != nil {
				return ratioCell(v)
			}
			return "(" + s.memory + " not run)"
		}
		w("| %s | %s | %s | %s | %s |\n", s.name,
			vsMem(runResult.rps),
			vsMem(runResult.totalCPUPerReq), // the memory llm_route has no redis CPU
			ratioCell(r.paired(i, runResult.rps)),
			ratioCell(r.paired(i, runResult.totalCPUPerReq)))
	}
	w("\nreq/s only compares proxies that are CPU-bound (Caddy core %% near 100, or Caddy + redis core %% near 100 with Redis pinned with it). ")
	w("When they are not (a shared machine), the CPU ratio is the stable figure, and its inverse is the throughput ratio at one saturated core: ")
	var caps []string
	for _, i := range shared {
		s := r.scs[i]
		if v := r.crossRatio(s.name, s.memory, runResult.totalCPUPerReq); v != nil {
			caps = append(caps, fmt.Sprintf("%s %.2f× %s (Caddy's CPU alone: %.2f×)", s.name, 1/median(v), s.memory,
				1/median(r.crossRatio(s.name, s.memory, runResult.cpuPerReq))))
		}
	}
	if len(caps) == 0 {
		caps = append(caps, "(memory scenarios not run)")
	}
	w("%s.\n", strings.Join(caps, ", "))

	w("\nCommands redis-server ran per request (INFO commandstats before the warm-up and after the last response of each run, ÷ every request of those runs, all rounds). ")
	w("A client call is a command Redis flags `noscript` (a script cannot run it: EVALSHA, EVAL, SUBSCRIBE, HELLO…); the others ran inside those scripts (or were sent on their own). ")
	w("The round trips are the socket reads Redis processed (INFO stats `total_reads_processed`, the benchmark's own INFO calls included): llm_route pipelines the calls pending at once, so under load one read carries many calls:\n\n")
	w("| scenario | requests | round trips (socket reads) /req | client calls /req | of which | inside scripts or other /req | llm_route state errors |\n|---|---:|---:|---:|---|---|---:|\n")
	var troubled []string
	for _, i := range shared {
		var reqs int64
		var errs float64
		off := r.roundsOffRedis(i)
		calls := map[string]int64{}
		for _, x := range r.runs[i][kindLLM] {
			reqs += x.all + x.errors
			errs += x.stateErrs
			for k, n := range x.stateCmds {
				calls[k] += n
			}
		}
		reads := calls[readsKey]
		delete(calls, readsKey)
		var trips int64
		var top, inner []string
		names := make([]string, 0, len(calls))
		for k := range calls {
			names = append(names, k)
		}
		slices.SortFunc(names, func(a, b string) int { return int(calls[b] - calls[a]) })
		per := func(n int64) string { return fmt.Sprintf("%.3f", float64(n)/float64(reqs)) }
		for _, k := range names {
			if r.noscript[k] {
				trips += calls[k]
				top = append(top, k+" "+per(calls[k]))
			} else {
				inner = append(inner, k+" "+per(calls[k]))
			}
		}
		w("| %s | %d | %s | %s | %s | %s | %.0f |\n", r.scs[i].name, reqs, per(reads), per(trips),
			strings.Join(top, ", "), strings.Join(inner, ", "), errs)
		if off > 0 {
			troubled = append(troubled, fmt.Sprintf("%s (%d of %d rounds)", r.scs[i].name, off, r.rounds))
		}
	}
	if len(troubled) > 0 {
		w("\n**Not on Redis throughout**: %s — llm_route's Redis calls failed or timed out (or it was still in the fallback when the run started), so it counted locally for a while; those figures are not wholly a Redis measurement, and the budget leaves those rounds out (see %s.log).\n",
			strings.Join(troubled, ", "), kindRedisName)
	}
	if rss := r.peakRSSKB[kindRedisName]; rss > 0 {
		w("\nPeak RSS of the llm_route with state redis: %.1f MiB.\n", float64(rss)/1024)
	}
}
