package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// The llmproxy adapter runs the original llm-proxy's config.yaml as it
// is. These tests use the shipped example, the original document's own.

const llmProxyExample = "../examples/llm-proxy-config.yaml"

// adaptLLMProxy adapts YAML text with the llmproxy adapter, as `caddy adapt
// --config config.yaml --adapter llmproxy` does.
func adaptLLMProxy(t *testing.T, yamlText string) ([]byte, []caddyconfig.Warning, error) {
	t.Helper()
	a := caddyconfig.GetAdapter("llmproxy")
	if a == nil {
		t.Fatal("no config adapter llmproxy registered")
	}
	return a.Adapt([]byte(yamlText), map[string]any{"filename": "config.yaml"})
}

// findLLMRoute returns the one llm_route handler object in an adapted
// config, wherever the adapter put it (a Caddyfile puts it in a subroute).
func findLLMRoute(t *testing.T, cfgJSON []byte) map[string]any {
	t.Helper()
	var cfg any
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	var found []map[string]any
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "llm_route" {
				found = append(found, v)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(cfg)
	if len(found) != 1 {
		t.Fatalf("want one llm_route handler, found %d in %s", len(found), cfgJSON)
	}
	return found[0]
}

// TestLLMProxyAdapterMatchesCaddyfile: the example YAML gives the same
// llm_route handler as the Caddyfile written for it by hand, field for
// field (durations, patches, think_tags, the key placeholder).
func TestLLMProxyAdapterMatchesCaddyfile(t *testing.T) {
	src, err := os.ReadFile(llmProxyExample)
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, warnings, err := adaptLLMProxy(t, string(src))
	if err != nil {
		t.Fatalf("adapting the example: %v", err)
	}
	// The one warning the example earns: its literal placeholder key.
	if len(warnings) != 1 || warnings[0].Line != 19 || !strings.Contains(warnings[0].Message, "providers[0].key") {
		t.Errorf("want one warning, for the literal key on line 19, got %v", warnings)
	}
	caddyfileSrc, err := os.ReadFile("testdata/llm-proxy-config.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	fromCaddyfile, cw, err := caddyconfig.GetAdapter("caddyfile").Adapt(caddyfileSrc, map[string]any{"filename": "llm-proxy-config.Caddyfile"})
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v", err)
	}
	if len(cw) > 0 {
		t.Errorf("Caddyfile warnings: %v", cw)
	}
	got, want := findLLMRoute(t, fromYAML), findLLMRoute(t, fromCaddyfile)
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("llm_route from the YAML:\n%s\nfrom the Caddyfile:\n%s", g, w)
	}

	// The server around it: the YAML's address, plain HTTP, /metrics first.
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen         []string          `json:"listen"`
					AutomaticHTTPS map[string]any    `json:"automatic_https"`
					Routes         []json.RawMessage `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(fromYAML, &cfg); err != nil {
		t.Fatal(err)
	}
	srv, ok := cfg.Apps.HTTP.Servers["llmproxy"]
	if !ok || len(cfg.Apps.HTTP.Servers) != 1 {
		t.Fatalf("want one server llmproxy, got %s", fromYAML)
	}
	if !reflect.DeepEqual(srv.Listen, []string{"0.0.0.0:8100"}) || srv.AutomaticHTTPS["disable"] != true {
		t.Errorf("server listens on %v with automatic_https %v, want 0.0.0.0:8100 and disabled", srv.Listen, srv.AutomaticHTTPS)
	}
	if len(srv.Routes) != 2 || !strings.Contains(string(srv.Routes[0]), `"path":["/metrics"]`) || !strings.Contains(string(srv.Routes[0]), `"handler":"metrics"`) {
		t.Errorf("want the /metrics route before llm_route, got %s", fromYAML)
	}
}

// TestLLMProxyConfigRuns: the example YAML, loaded as `caddy run --adapter
// llmproxy` loads it (only the port and the provider addresses changed),
// answers a chat request with the body the original document shows for it
// and Prometheus metrics on the same port. The key comes from the
// environment through ${ROUTER_API_KEY} and never appears in the adapted
// config.
func TestLLMProxyConfigRuns(t *testing.T) {
	src, err := os.ReadFile(llmProxyExample)
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, nil)
	port, adminPort := freePort(t), freePort(t)
	const secret = "sk-router-secret-7f3a"
	t.Setenv("ROUTER_API_KEY", secret)
	yamlText := substituteOnce(t, string(src),
		"host: 0.0.0.0 ", "host: 127.0.0.1 ",
		"port: 8100 ", fmt.Sprintf("port: %d ", port),
		`key: "sk-..."`, `key: "${ROUTER_API_KEY}"`,
		`"https://routerai.ru/api/v1"`, fmt.Sprintf("%q", up.base()),
		`"http://10.0.0.5:8080/v1"`, fmt.Sprintf("%q", closedURL(t)),
		`"https://api.minimax.io/v1"`, fmt.Sprintf("%q", closedURL(t)),
		`"https://opencode.ai/zen/go/v1"`, fmt.Sprintf("%q", closedURL(t)),
	)
	adapted, warnings, err := adaptLLMProxy(t, yamlText)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings: %v", warnings)
	}
	if strings.Contains(string(adapted), secret) || !strings.Contains(string(adapted), `"key":"{env.ROUTER_API_KEY}"`) {
		t.Fatalf("the adapted config must carry {env.ROUTER_API_KEY}, not the key: %s", adapted)
	}

	// Only what a test process needs on top: its own admin port and log.
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["admin"] = map[string]any{"listen": fmt.Sprintf("127.0.0.1:%d", adminPort)}
	p := startWholeConfig(t, cfg, port, adminPort, "the adapted config")

	// The document's worked example: my-gpt, its local upstream down, so
	// routerai-gpt4o answers with all three patch layers merged.
	resp := p.chat(`{"model": "my-gpt", "messages": [{"role": "user", "content": "привет"}], "temperature": 0.7}`)
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
		t.Fatalf("chat: %d %s\nlog:\n%s", resp.StatusCode, body, p.logs())
	}
	calls := up.Calls()
	if len(calls) != 1 {
		t.Fatalf("routerai got %d calls, want 1", len(calls))
	}
	var sent, want any
	if err := json.Unmarshal(calls[0].Body, &sent); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal([]byte(`{
		"model": "gpt-4o",
		"messages": [{"role": "user", "content": "привет"}],
		"temperature": 0.7,
		"provider": {"allow_fallbacks": false, "ignore": ["deepseek"]},
		"reasoning": {"enabled": false}
	}`), &want)
	if !reflect.DeepEqual(sent, want) {
		t.Errorf("body sent to routerai:\n%s\nwant the document's:\n%v", calls[0].Body, want)
	}
	if got := calls[0].Header.Get("Authorization"); got != "Bearer "+secret {
		t.Errorf("Authorization %q, want the key from ROUTER_API_KEY", got)
	}
	if calls[0].Header.Get("X-Opencode-Session") == "" {
		t.Error("no x-opencode-session header computed for routerai")
	}

	// GET /metrics on the same port, in Prometheus text format.
	mresp, err := testClient.Get(p.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics := readAll(t, mresp)
	if mresp.StatusCode != 200 || !strings.HasPrefix(mresp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %s", mresp.StatusCode, mresp.Header.Get("Content-Type"))
	}
	for _, series := range []string{
		`llm_proxy_requests_total{model="my-gpt",provider="routerai",result="ok",upstream="routerai-gpt4o"} 1`,
		`llm_proxy_requests_total{model="my-gpt",provider="local-llama",result="net_err",upstream="local-qwen"} 1`,
	} {
		if !strings.Contains(metrics, series+"\n") {
			t.Errorf("GET /metrics lacks %s; llm_proxy lines:\n%s", series, grepLines(metrics, "llm_proxy_requests_total"))
		}
	}

	// The model list is the YAML's models; other paths are 404.
	models := readAll(t, p.get("/v1/models"))
	for _, name := range []string{"my-gpt", "deepseek-fast-no-think", "local-qwen-only"} {
		if !strings.Contains(models, `"`+name+`"`) {
			t.Errorf("GET /v1/models lacks %s: %s", name, models)
		}
	}
	if r := p.get("/nothing-here"); r.StatusCode != 404 {
		t.Errorf("GET /nothing-here: %d, want 404", r.StatusCode)
	} else {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
}

// TestLLMProxyAdapterDefaultsAndMistakes: defaults of the server block,
// and each mistake of a config.yaml with the line it is on: the unquoted
// URL the original's documentation warns of, a bad duration, an unknown
// key.
func TestLLMProxyAdapterDefaultsAndMistakes(t *testing.T) {
	const base = "providers:\n  - id: p\n    url: \"http://127.0.0.1:9/v1\"\n" +
		"upstreams:\n  - id: u\n    provider: p\n    model: m\n" +
		"models:\n  - name: chat\n    upstreams: [u]\n"

	t.Run("defaults", func(t *testing.T) {
		for _, y := range []string{base, "server:\n" + base, "server:\n  host: \"\"\n" + base} {
			out, w, err := adaptLLMProxy(t, y)
			if err != nil || len(w) != 0 {
				t.Fatalf("adapt: %v %v", err, w)
			}
			if !strings.Contains(string(out), `"listen":["0.0.0.0:8100"]`) {
				t.Errorf("want the defaults 0.0.0.0:8100, got %s", out)
			}
		}
		out, _, err := adaptLLMProxy(t, "server:\n  host: \"::1\"\n  port: 9100\n"+base)
		if err != nil || !strings.Contains(string(out), `"listen":["[::1]:9100"]`) {
			t.Errorf("host ::1 port 9100: %v %s", err, out)
		}
	})

	warnings := []struct{ name, yaml, want string }{
		{"unquoted URL", strings.Replace(base, `"http://127.0.0.1:9/v1"`, "https://routerai.ru/api/v1", 1),
			`config.yaml:3: unquoted URL https://routerai.ru/api/v1: llm-proxy reads an unquoted value with "://" as a map and needs quotes ("https://routerai.ru/api/v1"); read here as the string`},
		{"unknown key", strings.Replace(base, "    model: m\n", "    model: m\n    max_concurent: 2\n", 1),
			`config.yaml:8: upstreams[0]: unknown key "max_concurent" (ignored, as llm-proxy ignores it)`},
		{"unknown top-level key", "metrics:\n  enabled: true\n" + base,
			`config.yaml:1: unknown key "metrics" (ignored, as llm-proxy ignores it)`},
		{"unknown model upstream", strings.Replace(base, "[u]", "[u, gone]", 1),
			`config.yaml:10: models[0].upstreams[1]: unknown upstream "gone": left out`},
		{"unknown think_tags", strings.Replace(base, "    model: m\n", "    model: m\n    think_tags: maybe\n", 1),
			`config.yaml:8: upstreams[0].think_tags: "maybe" is not off, split or strip: off, as llm-proxy reads it`},
	}
	for _, c := range warnings {
		t.Run(c.name, func(t *testing.T) {
			_, w, err := adaptLLMProxy(t, c.yaml)
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			if len(w) != 1 || w[0].String() != c.want {
				t.Errorf("warnings %q, want one: %s", w, c.want)
			}
		})
	}

	errs := []struct{ name, yaml, want string }{
		{"bad duration", strings.Replace(base, "    model: m\n", "    model: m\n    backoff: 5 minutes\n", 1),
			`config.yaml:8: upstreams[0].backoff: invalid ISO-8601 duration "5 minutes" (e.g. PT30S, PT15M, P1D)`},
		{"URL read as a map", strings.Replace(base, `"http://127.0.0.1:9/v1"`, "\n      https: //routerai.ru/api/v1", 1),
			`config.yaml:4: providers[0].url: want a string, got a map: quote URLs (url: "https://…")`},
		{"URL without scheme", strings.Replace(base, `"http://127.0.0.1:9/v1"`, "routerai.ru/api/v1", 1),
			`config.yaml:3: providers[0].url: want an http:// or https:// URL, got "routerai.ru/api/v1"`},
		{"unknown provider", strings.Replace(base, "provider: p", "provider: q", 1),
			`config.yaml:5: upstreams[0].provider: unknown provider "q"`},
		{"negative limit", strings.Replace(base, "    model: m\n", "    model: m\n    max_concurrency: -1\n", 1),
			`config.yaml:8: upstreams[0].max_concurrency: must not be negative`},
		{"patch not a map", strings.Replace(base, "    upstreams: [u]\n", "    upstreams: [u]\n    patch: [1, 2]\n", 1),
			`config.yaml:11: models[0].patch: want a map`},
		{"missing model", strings.Replace(base, "    model: m\n", "", 1),
			`config.yaml:5: upstreams[0]: model is required`},
		{"YAML syntax", base + "server: \"unterminated\n",
			`config.yaml:11: found unexpected end of stream`},
		{"bad port", "server:\n  port: 70000\n" + base,
			`config.yaml:2: server.port: want a port from 1 to 65535, got 70000`},
	}
	for _, c := range errs {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := adaptLLMProxy(t, c.yaml)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %s", err, c.want)
			}
		})
	}
}

// substituteOnce replaces each old string, which must occur exactly once.
func substituteOnce(t *testing.T, s string, oldNew ...string) string {
	t.Helper()
	for i := 0; i+1 < len(oldNew); i += 2 {
		if n := strings.Count(s, oldNew[i]); n != 1 {
			t.Fatalf("%q occurs %d times, want once", oldNew[i], n)
		}
		s = strings.Replace(s, oldNew[i], oldNew[i+1], 1)
	}
	return s
}
