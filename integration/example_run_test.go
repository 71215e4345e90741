package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestExampleQuickStart runs Caddyfile.example as shipped and the README's
// quick-start curl lines against it, so that neither can rot: the model
// list, a non-stream answer from the demo upstream after the local one
// failed (with its failover log lines), a stream with reasoning_content
// split out of <think>, and the metrics showing the local upstream cooling
// and the demo serving.
//
// Only addresses change: the example's fixed ports move to free ones (the
// machine is shared), and the two real back ends (the local GPU server and
// OpenRouter) become a port where nothing listens. That is what a fresh
// machine without a model server or network gives, and it keeps the test
// independent of what the network does. The demo site, the matchers and the
// handler config run exactly as written.
func TestExampleQuickStart(t *testing.T) {
	cmds := quickStartCommands(t)
	cfgJSON := exampleConfig(t)

	port, demoPort, adminPort := freePort(t), freePort(t), freePort(t)
	cfgJSON = replaceEach(t, cfgJSON,
		`"listen":["127.0.0.1:8100"]`, fmt.Sprintf(`"listen":["127.0.0.1:%d"]`, port),
		`"listen":["127.0.0.1:8101"]`, fmt.Sprintf(`"listen":["127.0.0.1:%d"]`, demoPort),
		`"url":"http://127.0.0.1:8101/v1"`, fmt.Sprintf(`"url":"http://127.0.0.1:%d/v1"`, demoPort),
		`"listen":"localhost:2019"`, fmt.Sprintf(`"listen":"127.0.0.1:%d"`, adminPort),
		`"url":"http://127.0.0.1:11434/v1"`, fmt.Sprintf(`"url":%q`, closedURL(t)),
		`"url":"https://openrouter.ai/api/v1"`, fmt.Sprintf(`"url":%q`, closedURL(t)),
	)
	// The example logs to stderr at Caddy's default level (INFO); the same
	// level goes to a file here so the test reads what the terminal shows.
	var cfg map[string]any
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		t.Fatal(err)
	}
	p := startWholeConfig(t, cfg, port, adminPort, "Caddyfile.example")

	seen := map[string]bool{}
	chat := "" // the quick start's non-stream request body
	for _, c := range cmds {
		switch {
		case c.path == "/v1/models":
			seen["models"] = true
			checkModelList(t, p)
		case c.path == "/v1/chat/completions" && strings.Contains(c.body, `"stream":true`):
			seen["stream"] = true
			checkDemoStream(t, p, c.body)
		case c.path == "/v1/chat/completions":
			seen["chat"] = true
			chat = c.body
			checkDemoAnswerAfterFailover(t, p, c.body)
		case c.path == "/metrics":
			seen["metrics"] = true
			if chat == "" {
				t.Fatal("the quick start scrapes the metrics before any chat request")
			}
			checkQuickStartMetrics(t, p, c, chat)
		default:
			t.Errorf("quick start runs %q, which this test does not check", c.line)
		}
	}
	for _, want := range []string{"models", "chat", "stream", "metrics"} {
		if !seen[want] {
			t.Errorf("the README quick start has no %s request", want)
		}
	}

	// The quick start's status page: the example serves it on its own port.
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "Open http://localhost:8100/llm-status/ in a browser") {
		t.Error("README.md's quick start does not open http://localhost:8100/llm-status/")
	}
	page := p.get("/llm-status/")
	if b := readAll(t, page); page.StatusCode != http.StatusOK || !strings.Contains(b, `<tr data-upstream="local-qwen"`) {
		t.Errorf("GET /llm-status/ on the example's port: %d, want the status page listing local-qwen:\n%s", page.StatusCode, b)
	}
	if st := p.get("/llm-status/status"); st.StatusCode != http.StatusOK || !strings.Contains(readAll(t, st), `"id":"demo"`) {
		t.Errorf("GET /llm-status/status on the example's port: %d, want the status JSON", st.StatusCode)
	}

	// The start-up path check finds the demo's model list: a new user's
	// first start shows no "provider url may be wrong" for the demo.
	demoModels, err := testClient.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/models", demoPort))
	if err != nil {
		t.Fatal(err)
	}
	demoModels.Body.Close()
	if demoModels.StatusCode != http.StatusOK {
		t.Errorf("the demo site answers GET /v1/models with %d, want 200 (the start-up path check warns on a 404)", demoModels.StatusCode)
	}
	if logs := p.logs(); strings.Contains(logs, "provider url may be wrong") {
		t.Errorf("the quick start warns of a wrong provider url:\n%s", logs)
	}

	// A stream asked for with JSON whitespace, on the model whose patch
	// rewrites the body, still reaches the demo's stream matcher.
	checkDemoStream(t, p, `{"model": "chat-no-think", "stream" : true, "messages": [{"role": "user", "content": "Hello \"stream\":false"}]}`)
	// and "stream": false, or "stream":true only inside a message, is a
	// plain answer.
	for _, body := range []string{
		`{"model":"chat","stream": false,"messages":[{"role":"user","content":"Hello"}]}`,
		`{"model":"local","messages":[{"role":"user","content":"say \"stream\":true"}]}`,
	} {
		resp := p.chat(body)
		msg := demoMessage(t, resp)
		if !strings.Contains(msg.Content, "demo fallback") {
			t.Errorf("%s: content %q", body, msg.Content)
		}
	}
}

// quickStartCommand is one curl line of the README's quick start.
type quickStartCommand struct {
	line string
	port string // 8100 (the site) or 2019 (admin)
	path string
	body string // -d '…'
	grep string // the `| grep -E '…'` filter, if any
	drop string // the `| grep -v '…'` filter, if any
}

var (
	curlURL  = regexp.MustCompile(`\blocalhost:(\d+)(/\S*)`)
	curlBody = regexp.MustCompile(`-d '([^']*)'`)
	curlGrep = regexp.MustCompile(`\| grep -E '([^']*)'`)
	curlDrop = regexp.MustCompile(`\| grep -v '([^']*)'`)
)

// quickStartCommands reads the curl lines of the first sh block under the
// README's "## Quick start".
func quickStartCommands(t *testing.T) []quickStartCommand {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md has no ## Quick start section")
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if ok {
		block, _, ok = strings.Cut(block, "```")
	}
	if !ok {
		t.Fatal("README.md quick start has no ```sh block")
	}
	var cmds []quickStartCommand
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		if !strings.HasPrefix(line, "curl ") {
			continue
		}
		m := curlURL.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("quick start line without a localhost URL: %s", line)
		}
		c := quickStartCommand{line: line, port: m[1], path: m[2]}
		if m := curlBody.FindStringSubmatch(line); m != nil {
			c.body = m[1]
		}
		if m := curlGrep.FindStringSubmatch(line); m != nil {
			c.grep = m[1]
		}
		if m := curlDrop.FindStringSubmatch(line); m != nil {
			c.drop = m[1]
		}
		want := "8100"
		if c.path == "/metrics" {
			want = "2019"
		}
		if c.port != want {
			t.Errorf("quick start line uses port %s, Caddyfile.example serves it on %s: %s", c.port, want, line)
		}
		cmds = append(cmds, c)
	}
	if len(cmds) == 0 {
		t.Fatal("README.md quick start has no curl line")
	}
	return cmds
}

// exampleConfig adapts Caddyfile.example; an adapter warning (an
// unformatted file included) fails the test.
func exampleConfig(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatalf("adapting Caddyfile.example: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("adapting Caddyfile.example: %s", w.String())
	}
	return string(out)
}

// replaceEach replaces each old string (which must occur exactly once:
// otherwise the example changed shape and the test must follow) by its new
// one.
func replaceEach(t *testing.T, s string, oldNew ...string) string {
	t.Helper()
	for i := 0; i+1 < len(oldNew); i += 2 {
		if n := strings.Count(s, oldNew[i]); n != 1 {
			t.Fatalf("adapted Caddyfile.example has %s %d times, want once:\n%s", oldNew[i], n, s)
		}
		s = strings.Replace(s, oldNew[i], oldNew[i+1], 1)
	}
	return s
}

func checkModelList(t *testing.T, p *proxy) {
	t.Helper()
	resp := p.get("/v1/models")
	body := readAll(t, resp)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil || list.Object != "list" {
		t.Fatalf("GET /v1/models = %d %s", resp.StatusCode, body)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if got := strings.Join(ids, ","); got != "chat,chat-no-think,local" {
		t.Errorf("model list = %s, want chat,chat-no-think,local", got)
	}
}

// chatMessage is the assistant message of a non-stream answer.
type chatMessage struct {
	Content          string `json:"content"`
	ReasoningContent string `json:"reasoning_content"`
}

// demoMessage checks that resp is the demo's non-stream chat.completion,
// think tags split, and returns its message.
func demoMessage(t *testing.T, resp *http.Response) chatMessage {
	t.Helper()
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var c struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Created int64  `json:"created"`
		Choices []struct {
			Message      chatMessage `json:"message"`
			FinishReason string      `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("not a chat.completion (%v): %s", err, body)
	}
	if c.Object != "chat.completion" || c.Model != "demo" || c.Choices[0].FinishReason != "stop" {
		t.Errorf("object %q model %q finish_reason %q: %s", c.Object, c.Model, c.Choices[0].FinishReason, body)
	}
	if age := time.Since(time.Unix(c.Created, 0)); age < -time.Minute || age > time.Hour {
		t.Errorf("created = %d: the {time.now.unix} placeholder was not replaced", c.Created)
	}
	m := c.Choices[0].Message
	if strings.Contains(m.Content, "think>") || !strings.Contains(m.ReasoningContent, "failed over to the demo") {
		t.Errorf("think tags not split: content %q reasoning_content %q", m.Content, m.ReasoningContent)
	}
	return m
}

func checkDemoAnswerAfterFailover(t *testing.T, p *proxy, body string) {
	t.Helper()
	m := demoMessage(t, p.chat(body))
	for _, want := range []string{"demo fallback", "llama.cpp or Ollama", "OPENROUTER_API_KEY"} {
		if !strings.Contains(m.Content, want) {
			t.Errorf("demo answer does not say %q: %q", want, m.Content)
		}
	}
	// Both real upstreams were tried first and failed over, at INFO.
	var hops []string
	for _, e := range p.logEntries("failover") {
		if e["level"] != "info" || e["model"] != "chat" {
			t.Errorf("failover entry %v", e)
		}
		hops = append(hops, fmt.Sprintf("%v>%v:%v", e["from"], e["to"], e["result"]))
	}
	if got, want := strings.Join(hops, " "), "local-qwen>cloud-qwen:net_err cloud-qwen>demo:net_err"; got != want {
		t.Errorf("failover log = %q, want %q", got, want)
	}
}

func checkDemoStream(t *testing.T, p *proxy, body string) {
	t.Helper()
	resp := p.chat(body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream status %d: %s", resp.StatusCode, readAll(t, resp))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("stream Content-Type = %q, want text/event-stream", ct)
	}
	events := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(events) < 3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end in [DONE]: %q", events)
	}
	var content, reasoning strings.Builder
	finish := ""
	for _, ev := range events[:len(events)-1] {
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &chunk); err != nil || chunk.Object != "chat.completion.chunk" || len(chunk.Choices) != 1 {
			t.Fatalf("not a chat.completion.chunk (%v): %s", err, ev)
		}
		content.WriteString(chunk.Choices[0].Delta.Content)
		reasoning.WriteString(chunk.Choices[0].Delta.ReasoningContent)
		if f := chunk.Choices[0].FinishReason; f != nil {
			finish = *f
		}
	}
	// The closing tag is split across two events; nothing of it may leak.
	if c := content.String(); strings.Contains(c, "<") || !strings.HasPrefix(c, "This is the llm_route demo fallback") {
		t.Errorf("stream content = %q", c)
	}
	if r := reasoning.String(); !strings.HasPrefix(r, "The upstreams before me were busy or failed") || !strings.HasSuffix(r, "moved it to reasoning_content.") {
		t.Errorf("stream reasoning_content = %q", r)
	}
	if finish != "stop" {
		t.Errorf("finish_reason = %q, want stop", finish)
	}
}

// checkQuickStartMetrics checks what the metrics line of the quick start
// shows; chat is a request body that fails over from the local upstream.
func checkQuickStartMetrics(t *testing.T, p *proxy, c quickStartCommand, chat string) {
	t.Helper()
	if c.grep == "" {
		t.Fatal("the metrics line of the quick start has no grep -E filter")
	}
	keep := regexp.MustCompile(c.grep)
	drop := regexp.MustCompile("^$") // drops nothing the keep filter let through
	if c.drop != "" {
		drop = regexp.MustCompile(c.drop)
	}
	shown := func() string {
		var lines []string
		for _, line := range strings.Split(p.metrics(), "\n") {
			if keep.MatchString(line) && !drop.MatchString(line) {
				lines = append(lines, line)
			}
		}
		return strings.Join(lines, "\n")
	}
	// value returns a series' value in the shown lines, -1 when not shown.
	value := func(out, name string, labels ...string) float64 {
		for _, line := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(line, series(name, labels...)+" "); ok {
				var v float64
				if _, err := fmt.Sscan(rest, &v); err == nil {
					return v
				}
			}
		}
		return -1
	}
	out := shown()
	if v := value(out, "llm_proxy_requests_total", "model", "chat", "upstream", "local-qwen", "provider", "local", "result", "net_err"); v < 1 {
		t.Errorf("local-qwen net_err = %v in\n%s", v, out)
	}
	if v := value(out, "llm_proxy_upstream_fail_streak", "upstream", "local-qwen", "provider", "local"); v < 1 {
		t.Errorf("local-qwen fail_streak = %v in\n%s", v, out)
	}
	// The non-stream and the stream answer of the quick start.
	if v := value(out, "llm_proxy_requests_total", "model", "chat", "upstream", "demo", "provider", "demo", "result", "ok"); v < 2 {
		t.Errorf("demo ok = %v in\n%s", v, out)
	}
	if v := value(out, "llm_proxy_upstream_fail_streak", "upstream", "demo", "provider", "demo"); v > 0 {
		t.Errorf("demo fail_streak = %v in\n%s", v, out)
	}
	// The first failure cools the local upstream for 1 s, and a failed
	// probe does not extend it: on a slow machine that second may be over
	// by now. Each further chat request that tries it again doubles the
	// backoff (2 s, 4 s, …), so the cooling is soon longer than a scrape.
	eventually(t, 60*time.Second, "local-qwen cooling in the quick-start metrics", func() bool {
		out = shown()
		if value(out, "llm_proxy_upstream_cooling_seconds", "upstream", "local-qwen", "provider", "local") > 0 {
			return true
		}
		_ = demoMessage(t, p.chat(chat))
		return false
	})
	if v := value(out, "llm_proxy_upstream_cooling_seconds", "upstream", "demo", "provider", "demo"); v > 0 {
		t.Errorf("demo cooling = %v in\n%s", v, out)
	}
}

// TestExampleListensOnLoopbackOnly: Caddyfile.example has no client keys and
// reads a cloud key from the environment, so a site reachable from other
// machines would relay anyone's requests on that key. Every address it
// listens on must be loopback.
func TestExampleListensOnLoopbackOnly(t *testing.T) {
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal([]byte(exampleConfig(t)), &cfg); err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, srv := range cfg.Apps.HTTP.Servers {
		for _, addr := range srv.Listen {
			n++
			na, err := caddy.ParseNetworkAddress(addr)
			if err != nil {
				t.Fatalf("server %s: listen %q: %v", name, addr, err)
			}
			if ip := net.ParseIP(na.Host); na.Host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				t.Errorf("server %s listens on %q: not loopback (Caddyfile.example has no client keys)", name, addr)
			}
		}
	}
	if n == 0 {
		t.Fatal("Caddyfile.example listens nowhere")
	}
}
