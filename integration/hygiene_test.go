package integration

// Issue #10 items 2 and 5: gauges of draining upstreams, metric series that
// follow the loaded config, and the units in the logs.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// heldStream answers a stream with its first chunk, then holds the rest
// until the gate opens.
func heldStream(g *gate) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		events := sseChunks("held stream")
		writeStream(w, events[:1], 0)
		g.arrived <- struct{}{}
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
		for _, ev := range events[1:] {
			_, _ = io.WriteString(w, ev)
		}
	}
}

// seriesLines returns the sample lines of the llm_proxy_* families that
// carry the given label value.
func seriesLines(text, label string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "llm_proxy_") && strings.Contains(line, label) {
			out = append(out, line)
		}
	}
	return out
}

func TestDrainingUpstreamKeepsItsGauges(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, heldStream(g))
	conf := func(upstream string) map[string]any {
		return cfg(
			[]map[string]any{obj("id", "dp", "url", up.base(), "backoff", "1m")},
			[]map[string]any{obj("id", upstream, "provider", "dp", "model", "x", "max_concurrency", 1)},
			[]map[string]any{obj("name", "dm", "upstreams", []string{upstream})},
		)
	}
	p := startProxy(t, conf("old-gpu"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := p.post(ctx, chatBody("dm", true))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	g.waitArrivals(t, 1) // the stream runs on old-gpu, first chunk sent

	p.load(conf("new-gpu")) // renamed: old-gpu is in no loaded config now
	text := scrape(t, p)
	for _, gauge := range []string{"inflight 1", "fail_streak 0", "cooling_seconds 0"} {
		name, value, _ := strings.Cut(gauge, " ")
		want := series("llm_proxy_upstream_"+name, "upstream", "old-gpu", "provider", "dp") + " " + value
		if !strings.Contains(text, want) {
			t.Errorf("while its stream runs, the removed upstream's %s is not reported: want %q in\n%s",
				name, want, strings.Join(seriesLines(text, "gpu"), "\n"))
		}
	}
	if !strings.Contains(text, series("llm_proxy_upstream_inflight", "upstream", "new-gpu", "provider", "dp")+" 0") {
		t.Error("the new upstream's inflight gauge is missing")
	}

	g.open()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("the held stream did not end normally: %s", body)
	}
	eventually(t, 5*time.Second, "the drained upstream's series dropped", func() bool {
		return len(seriesLines(scrape(t, p), `upstream="old-gpu"`)) == 0
	})
	if len(seriesLines(scrape(t, p), `upstream="new-gpu"`)) == 0 {
		t.Error("the new upstream's series went too")
	}
}

func TestMetricSeriesFollowTheLoadedConfig(t *testing.T) {
	up := newUpstream(t, nil)
	conf := func(model, upstream string) map[string]any {
		return cfg(
			[]map[string]any{obj("id", "hp", "url", up.base())},
			[]map[string]any{obj("id", upstream, "provider", "hp", "model", "x", "max_concurrency", 2)},
			[]map[string]any{
				obj("name", model, "upstreams", []string{upstream}, "queue_size", 4),
				obj("name", model+"-noqueue", "upstreams", []string{upstream}),
			},
		)
	}
	p := startProxy(t, conf("model-a", "up-a"))

	// The queue depth exists from the start, before anyone waited.
	text := scrape(t, p)
	if !strings.Contains(text, series("llm_proxy_queue_depth", "model", "model-a")+" 0") {
		t.Errorf("llm_proxy_queue_depth of a model with a queue is missing at start:\n%s",
			strings.Join(seriesLines(text, "queue_depth"), "\n"))
	}
	if strings.Contains(text, series("llm_proxy_queue_depth", "model", "model-a-noqueue")) {
		t.Error("a model without a queue has a queue depth series")
	}
	for i := 0; i < 2; i++ {
		resp := p.chat(chatBody("model-a", false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	if got := p.requests("model-a", "up-a", "hp", "ok"); got != 2 {
		t.Fatalf("ok requests of model-a = %v, want 2", got)
	}

	// A reload that renames the model and the upstream drops their series,
	// counters included.
	p.load(conf("model-b", "up-b"))
	text = scrape(t, p)
	if stale := seriesLines(text, `"model-a`); len(stale) > 0 {
		t.Errorf("series of a model in no loaded config remain:\n%s", strings.Join(stale, "\n"))
	}
	if stale := seriesLines(text, `"up-a"`); len(stale) > 0 {
		t.Errorf("series of an upstream in no loaded config remain:\n%s", strings.Join(stale, "\n"))
	}
	if !strings.Contains(text, series("llm_proxy_queue_depth", "model", "model-b")+" 0") {
		t.Error("the new model's queue depth is missing")
	}
	resp := p.chat(chatBody("model-b", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	okB := p.requests("model-b", "up-b", "hp", "ok")
	if okB != 1 {
		t.Fatalf("ok requests of model-b = %v, want 1", okB)
	}

	// A load that fails changes nothing: the series its provisioning made
	// go again, the running config's stay with their values.
	bad := llmHandler(conf("model-c", "up-c"))
	broken := llmHandler(cfg(
		[]map[string]any{obj("id", "hp", "url", up.base(), "patch", "not an object")},
		[]map[string]any{obj("id", "up-c", "provider", "hp", "model", "x")},
		[]map[string]any{obj("name", "model-c", "upstreams", []string{"up-c"})},
	))
	if err := p.loadRoutes([]any{obj("handle", []any{bad, broken})}); err == nil {
		t.Fatal("a config with a broken handler loaded")
	}
	text = scrape(t, p)
	if stale := seriesLines(text, `"model-c`); len(stale) > 0 {
		t.Errorf("a failed load left series behind:\n%s", strings.Join(stale, "\n"))
	}
	if got := p.requests("model-b", "up-b", "hp", "ok"); got != okB {
		t.Errorf("after a failed load: ok of model-b = %v, want %v", got, okB)
	}
	if !strings.Contains(text, series("llm_proxy_queue_depth", "model", "model-b")+" 0") {
		t.Error("after a failed load the running model's queue depth is missing")
	}
	resp = p.chat(chatBody("model-b", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the failed load: status %d: %s", resp.StatusCode, body)
	}
}

func TestLogsSayUnlimitedAndCarryUnits(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "lp", "url", up.base(), "first_byte_timeout", "PT45S", "stream_idle_timeout", "0s")},
		[]map[string]any{
			obj("id", "lu-free", "provider", "lp", "model", "x"),
			obj("id", "lu-two", "provider", "lp", "model", "x", "max_concurrency", 2),
		},
		[]map[string]any{obj("name", "lm", "upstreams", []string{"lu-free", "lu-two"})},
		"request_timeout", "90s",
	))
	resp := p.chat(chatBody("lm", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}

	var done map[string]any
	eventually(t, 5*time.Second, "the request log", func() bool {
		for _, e := range p.logEntries("request completed") {
			if e["upstream"] == "lu-free" {
				done = e
				return true
			}
		}
		return false
	})
	if done["limit"] != "unlimited" { // a string like the summary's "2"
		t.Errorf(`request log of an upstream without a limit: "limit" = %#v, want "unlimited"`, done["limit"])
	}

	summaries := p.logEntries("llm_route configured")
	if len(summaries) == 0 {
		t.Fatal("no start-up summary")
	}
	sum := summaries[len(summaries)-1]
	if got := sum["request_timeout"]; got != "1m30s" {
		t.Errorf("summary request_timeout = %#v, want \"1m30s\"", got)
	}
	eff, _ := sum["effective"].(map[string]any)
	free, _ := eff["lu-free"].(map[string]any)
	two, _ := eff["lu-two"].(map[string]any)
	for _, c := range []struct {
		entry map[string]any
		field string
		want  any
	}{
		{free, "limit", "unlimited"},
		{two, "limit", "2"},
		{free, "first_byte_timeout", "45s"},
		{free, "stream_idle_timeout", "off"},
		{free, "probe_interval", "1s"},
	} {
		if got := c.entry[c.field]; got != c.want {
			t.Errorf("summary %s = %#v, want %#v (entry %v)", c.field, got, c.want, c.entry)
		}
	}
	if s := fmt.Sprint(sum); strings.Contains(s, "9223372036854775807") || strings.Contains(s, "9.223372036854776e+18") {
		t.Errorf("the summary shows the unlimited sentinel: %s", s)
	}
}
