package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestProberNonChatUpstream: an upstream that serves no chat (a
// messages-only Anthropic-style server, a responses-only one) is probed in
// its own API: the probe goes to its path with the provider's auth header
// (and anthropic-version for Messages), the model swapped and the patches
// merged; its answer ends the cooling long before the backoff would.
func TestProberNonChatUpstream(t *testing.T) {
	for _, tc := range []struct {
		api, path, front, body string
		answer                 http.HandlerFunc
	}{
		{"messages", "/v1/messages", "/v1/messages", `{"model":"pm","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, nativeMessages("4")},
		{"responses", "/v1/responses", "/v1/responses", `{"model":"pm","input":"hi"}`, nativeResponses("4")},
	} {
		t.Run(tc.api, func(t *testing.T) {
			var mu sync.Mutex
			var probes []upstreamCall
			wrong := 0
			g := newGate()
			defer g.open()
			healthy := false
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				body := readReq(r)
				mu.Lock()
				isProbe := strings.Contains(body, "2+2=")
				if r.URL.Path != tc.path {
					wrong++
				} else if isProbe {
					probes = append(probes, upstreamCall{Path: r.URL.Path, Header: r.Header.Clone(), Body: []byte(body)})
				}
				ok := healthy
				mu.Unlock()
				switch {
				case r.URL.Path != tc.path:
					http.Error(w, "not found", http.StatusNotFound)
				case isProbe || ok:
					tc.answer(w, r)
				default:
					g.handler(status(500))(w, r)
				}
			})
			auth := map[string]string{"messages": "x-api-key", "responses": "bearer"}[tc.api]
			p := startProxy(t, cfg(
				[]map[string]any{obj("id", "pp-"+tc.api, "url", up.base(), "key", "sk-test-probe", "auth", auth,
					"apis", []string{tc.api}, "backoff", "5m", "probe_interval", "100ms", "patch", obj("top_k", 3))},
				[]map[string]any{obj("id", "pu-"+tc.api, "provider", "pp-"+tc.api, "model", "real-x", "max_concurrency", 4)},
				[]map[string]any{obj("name", "pm", "upstreams", []string{"pu-" + tc.api})}))
			uid, pid := "pu-"+tc.api, "pp-"+tc.api

			// Four failures at once: cooling 1+2+4+8 s, until ~8 s from now.
			done := make(chan int, 4)
			for i := 0; i < 4; i++ {
				go func() {
					resp, err := testClient.Post(p.URL+tc.front, "application/json", strings.NewReader(tc.body))
					if err != nil {
						done <- 0
						return
					}
					resp.Body.Close()
					done <- resp.StatusCode
				}()
			}
			g.waitArrivals(t, 4)
			mu.Lock()
			healthy = true // from now on the upstream answers; only a probe can tell
			mu.Unlock()
			g.open()
			for i := 0; i < 4; i++ {
				<-done
			}
			if c := p.upstreamGauge("cooling_seconds", uid, pid); c <= 4 {
				t.Fatalf("cooling %v s after four failures, want > 4", c)
			}

			eventually(t, 6*time.Second, "a probe answered", func() bool {
				return p.metric("llm_proxy_probe_pings_total", "upstream", uid, "provider", pid, "result", "ok") >= 1
			})
			if c := p.upstreamGauge("cooling_seconds", uid, pid); c != 0 {
				t.Fatalf("cooling %v s after a good probe", c)
			}
			mu.Lock()
			pr, nWrong := append([]upstreamCall(nil), probes...), wrong
			mu.Unlock()
			if nWrong != 0 || len(pr) == 0 {
				t.Fatalf("probes at %s: %d, elsewhere: %d", tc.path, len(pr), nWrong)
			}
			var body map[string]any
			if err := json.Unmarshal(pr[0].Body, &body); err != nil || body["model"] != "real-x" || body["top_k"] != float64(3) || body["stream"] != true {
				t.Fatalf("probe body %s (%v)", pr[0].Body, err)
			}
			h := pr[0].Header
			switch tc.api {
			case "messages":
				if h.Get("X-Api-Key") != "sk-test-probe" || h.Get("Authorization") != "" || h.Get("Anthropic-Version") == "" ||
					body["messages"] == nil || body["max_tokens"] == nil {
					t.Fatalf("messages probe headers %v body %s", h, pr[0].Body)
				}
			case "responses":
				if h.Get("Authorization") != "Bearer sk-test-probe" || body["input"] == nil || body["messages"] != nil {
					t.Fatalf("responses probe headers %v body %s", h, pr[0].Body)
				}
			}

			// Back in the pool: a client request is served.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+tc.front, strings.NewReader(tc.body))
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(got, `"4"`) {
				t.Fatalf("after the probe: %d %s", resp.StatusCode, got)
			}
		})
	}
}

// readReq reads the request body and puts it back for the handler after.
func readReq(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	return string(b)
}
