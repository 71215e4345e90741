package integration

// Issue #10 item 16: config mistakes caught when the config loads.

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestKeyPlaceholderResolvingToEmptyWarns(t *testing.T) {
	up := newUpstream(t, nil)
	t.Setenv("LLMROUTE_IT_SET_KEY", "sk-test-secret-set")
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "typo-p", "url", up.base(), "key", "{env.LLMROUTE_IT_KEY_NOBODY_SET}"),
			obj("id", "set-p", "url", up.base(), "key", "{env.LLMROUTE_IT_SET_KEY}"),
			obj("id", "keyless-p", "url", up.base()),
		},
		[]map[string]any{
			obj("id", "typo-u", "provider", "typo-p", "model", "x"),
			obj("id", "set-u", "provider", "set-p", "model", "x"),
			obj("id", "keyless-u", "provider", "keyless-p", "model", "x"),
		},
		[]map[string]any{obj("name", "m", "upstreams", []string{"typo-u", "set-u", "keyless-u"})},
	))
	var warned []string
	for _, e := range p.logEntries("provider key resolves to empty; requests go without an Authorization header") {
		if e["level"] != "warn" {
			t.Errorf("logged at %v, want warn", e["level"])
		}
		warned = append(warned, e["provider"].(string))
	}
	if len(warned) != 1 || warned[0] != "typo-p" {
		t.Errorf("warned for providers %v, want exactly [typo-p] (a key that resolves, and no key at all, are fine)", warned)
	}
	if strings.Contains(p.logs(), "sk-test-secret-set") {
		t.Error("a key reached the log")
	}
	// It is a warning, not an error: the config runs.
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

func TestHeaderWithLineBreakRefusedAtLoad(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 1))
	t.Setenv("LLMROUTE_IT_TITLE", "my app\r\nX-Injected: sk-test-secret-hdr")
	for _, tc := range []struct{ name, value string }{
		{"after placeholder resolution", "{env.LLMROUTE_IT_TITLE}"},
		{"literal", "a\nb"},
		{"other control character", "a\x00b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.loadErr(cfg(
				[]map[string]any{obj("id", "hdr-p", "url", up.base(), "headers", obj("X-Title", tc.value, "HTTP-Referer", "https://ok.example"))},
				[]map[string]any{obj("id", "hdr-u", "provider", "hdr-p", "model", "x")},
				[]map[string]any{obj("name", "m", "upstreams", []string{"hdr-u"})},
			))
			if err == nil {
				t.Fatal("a header value with a control character loaded")
			}
			for _, want := range []string{`provider "hdr-p"`, `header "X-Title"`} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
			if strings.Contains(err.Error(), "sk-test-secret") || strings.Contains(err.Error(), "my app") {
				t.Errorf("error echoes the value: %v", err)
			}
		})
	}
	// The running config is untouched.
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

func TestAdminLoadErrorNamesFieldAndEntry(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 1))
	good := basicConfig(up, 1)
	for _, tc := range []struct {
		name string
		edit func(h map[string]any)
		want string
	}{
		{"upstream duration", func(h map[string]any) {
			h["upstreams"] = []any{
				obj("id", "cpu", "provider", "p1", "model", "a"),
				obj("id", "gpu", "provider", "p1", "model", "b", "first_byte_timeout", "3x"),
			}
		}, `upstreams[1] "gpu": first_byte_timeout: invalid duration "3x"`},
		{"provider duration", func(h map[string]any) {
			h["providers"] = []any{obj("id", "p1", "url", up.base(), "backoff", "-1s")}
		}, `providers[0] "p1": backoff: invalid duration "-1s": must not be negative`},
		{"model duration", func(h map[string]any) {
			h["models"] = []any{obj("name", "m", "upstreams", []string{"u1"}, "queue_timeout", "soon")}
		}, `models[0] "m": queue_timeout: invalid duration "soon"`},
		{"handler duration", func(h map[string]any) { h["request_timeout"] = "PT5X" },
			`request_timeout: invalid duration "PT5X"`},
		{"wrong type", func(h map[string]any) {
			h["upstreams"] = []any{obj("id", "u1", "provider", "p1", "model", "a", "max_concurrency", "two")}
		}, `upstreams[0] "u1": max_concurrency: want int, got string`},
		{"unknown field", func(h map[string]any) {
			h["providers"] = []any{obj("id", "p1", "url", up.base(), "max_concurency", 2)}
		}, `providers[0] "p1": unknown field "max_concurency"`},
		{"entry without id", func(h map[string]any) {
			h["upstreams"] = []any{obj("provider", "p1", "model", "a", "stream_idle_timeout", true)}
		}, `upstreams[0]: stream_idle_timeout: invalid duration true`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]any{}
			for k, v := range good {
				h[k] = v
			}
			tc.edit(h)
			resp, err := testClient.Post(p.admin+"/load", "application/json", bytes.NewReader(p.config(h)))
			if err != nil {
				t.Fatal(err)
			}
			// Caddy starts a new admin server for the candidate before it
			// finds the mistake, and stops the old one in the background.
			awaitOldListeners(t, p.config(h))
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("POST /load: status %d, want 400; body %s", resp.StatusCode, body)
			}
			// The admin API answers {"error": "..."}: JSON-escaped quotes.
			want := strings.ReplaceAll(tc.want, `"`, `\"`)
			if !strings.Contains(string(body), want) {
				t.Errorf("POST /load answered\n%s\nwant it to contain\n%s", body, want)
			}
		})
	}
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("the running config after failed loads: status %d: %s", resp.StatusCode, body)
	}
}
