package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Target kinds: the same Caddy binary with the llm_route handler, and with
// a plain reverse_proxy to the same fake upstream.
const (
	kindLLM   = "llm_route"
	kindPlain = "reverse_proxy"
)

// kindBaseName names the llm_route process run from the -baseline binary (a
// build of the previous main): the same config as kindLLM, another build.
const kindBaseName = "llm_route-baseline"

// proxyProc is one running Caddy process.
type proxyProc struct {
	kind  string
	name  string // kind, or kindRedisName / kindBaseName for the other llm_route processes
	cmd   *exec.Cmd
	pid   string
	url   string // http://127.0.0.1:port
	admin string // http://127.0.0.1:port of the admin API (pprof lives there)
	log   string // path of its stdout+stderr
}

// caddyConfig renders a whole Caddy JSON config around one handler: admin on
// its own loopback port (config not persisted), WARN-level logs, no access
// logs, plain HTTP/1.1.
func caddyConfig(port, adminPort int, handler map[string]any) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"admin": map[string]any{
			"listen": fmt.Sprintf("127.0.0.1:%d", adminPort),
			"config": map[string]any{"persist": false},
		},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "WARN"}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"bench": map[string]any{
			"listen":          []string{fmt.Sprintf("127.0.0.1:%d", port)},
			"automatic_https": map[string]any{"disable": true},
			"protocols":       []string{"h1"}, // plain HTTP: h2/h3 would need TLS
			"routes":          []any{map[string]any{"handle": []any{handler}}},
		}}}},
	}, "", "  ")
}

// llmHandler is the llm_route handler: model "bench" → upstream model
// "real-model" (think_tags off: bytes pass through), and "bench-think" →
// "think-model" with think_tags split. router adds the router model "auto"
// (one catch-all rule using "bench") and "bench-guard" ("real-model" with
// repeat_guard on), which builds before router models or the guard cannot
// load.
func llmHandler(upstreamURL string, router bool) map[string]any {
	h := llmHandlerBase(upstreamURL)
	if router {
		name, _, _ := strings.Cut(routerModel, ":")
		h["models"] = append(h["models"].([]any), map[string]any{"name": name,
			"rules": []any{map[string]any{"name": "all", "use": []string{clientModel}}}},
			map[string]any{"name": clientGuardModel, "upstreams": []string{"real"}, "repeat_guard": "on"})
	}
	return h
}

func llmHandlerBase(upstreamURL string) map[string]any {
	return map[string]any{
		"handler": "llm_route",
		"providers": []any{map[string]any{"id": "fake", "url": upstreamURL + "/v1",
			// The fake upstream picks its answer by this header; the client
			// header allow-list keeps it back unless the provider names it.
			"forward_headers": []string{modeHeader}},
			// The same server as a native Messages upstream (fronts.go).
			map[string]any{"id": "fake-msg", "url": upstreamURL + "/v1", "apis": []string{"messages"},
				"auth": "x-api-key", "forward_headers": []string{modeHeader}}},
		"upstreams": []any{
			map[string]any{"id": "real", "provider": "fake", "model": realModel},
			map[string]any{"id": "think", "provider": "fake", "model": realThinkModel, "think_tags": "split"},
			map[string]any{"id": "msg", "provider": "fake-msg", "model": realModel},
		},
		"models": []any{
			map[string]any{"name": clientModel, "upstreams": []string{"real"}},
			map[string]any{"name": clientThinkModel, "upstreams": []string{"think"}},
			map[string]any{"name": clientMsgModel, "upstreams": []string{"msg"}},
		},
	}
}

// plainHandler is a reverse_proxy to the fake upstream that rewrites
// nothing (the client's path /v1/chat/completions goes through as is).
// idlePerHost sets keep_alive.max_idle_conns_per_host (Caddy's default is
// 32, which would make it open connections at 64 clients); 0 keeps Caddy's
// default.
func plainHandler(upstreamAddr string, idlePerHost int) map[string]any {
	h := map[string]any{
		"handler":   "reverse_proxy",
		"upstreams": []any{map[string]any{"dial": upstreamAddr}},
	}
	if idlePerHost > 0 {
		h["transport"] = map[string]any{
			"protocol":   "http",
			"keep_alive": map[string]any{"max_idle_conns_per_host": idlePerHost},
		}
	}
	return h
}

// startProxy writes the config and starts `caddy run` with it, pinned to
// cpu through taskset when cpu is not empty, and waits until it answers.
// name names its files (config, log); it is the kind unless two processes
// share one.
func startProxy(bin, outDir, kind, name, cpu string, handler map[string]any) (*proxyProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	aport, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg, err := caddyConfig(port, aport, handler)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(outDir, name+".json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(outDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()

	args := []string{bin, "run", "--config", cfgPath}
	if cpu != "" {
		// taskset execs caddy in place, so the PID is caddy's.
		args = append([]string{"taskset", "-c", cpu}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	home := filepath.Join(outDir, "caddy-home")
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_DATA_HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %v", kind, err)
	}
	p := &proxyProc{
		kind:  kind,
		name:  name,
		cmd:   cmd,
		pid:   strconv.Itoa(cmd.Process.Pid),
		url:   fmt.Sprintf("http://127.0.0.1:%d", port),
		admin: fmt.Sprintf("http://127.0.0.1:%d", aport),
		log:   logPath,
	}
	if err := p.waitReady(30 * time.Second); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// waitReady polls the admin API until the config is loaded and the server
// port accepts connections.
func (p *proxyProc) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if p.cmd.ProcessState != nil {
			break
		}
		resp, err := c.Get(p.admin + "/config/")
		if err == nil {
			resp.Body.Close()
			if conn, err := net.DialTimeout("tcp", p.url[len("http://"):], time.Second); err == nil {
				conn.Close()
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s did not come up within %v; see %s", p.name, limit, p.log)
}

// stop asks Caddy to shut down and kills it if it does not within 5 s.
func (p *proxyProc) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
