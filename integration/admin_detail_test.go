package integration

// Status details (last failure class, last probe, oldest queue
// wait) and explain's "API not served" verdict, with the routing rule it
// reports: a front's request only goes to upstreams that can serve its API.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

type statusDetailJSON struct {
	Upstreams []struct {
		ID          string  `json:"id"`
		LastFailure *string `json:"last_failure"`
		LastProbe   *struct {
			Result string    `json:"result"`
			At     time.Time `json:"at"`
		} `json:"last_probe"`
	} `json:"upstreams"`
	Models []struct {
		Name              string  `json:"name"`
		OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	} `json:"models"`
}

func (p *proxy) statusDetail() (statusDetailJSON, string) {
	p.t.Helper()
	_, raw := p.status()
	var s statusDetailJSON
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		p.t.Fatal(err)
	}
	return s, raw
}

func TestAdminStatusFailureProbeAndOldestWait(t *testing.T) {
	v := startVisibility(t)
	s, raw := v.p.statusDetail()
	for _, key := range []string{`"last_failure":null`, `"last_probe":null`, `"oldest_wait_seconds":0`} {
		if !strings.Contains(raw, key) {
			t.Errorf("status lacks %s: %s", key, raw)
		}
	}
	failure := map[string]string{}
	for _, u := range s.Upstreams {
		failure[u.ID] = reason(u.LastFailure)
	}
	if failure["flaky"] != "5xx" || failure["limited"] != "429" || failure["own"] != "429" || failure["held"] != "null" {
		t.Errorf("last_failure = %v, want flaky 5xx, limited/own 429, held null", failure)
	}

	// The prober keeps failing on flaky (it answers 500).
	eventually(t, 15*time.Second, "flaky's last probe in the status", func() bool {
		s, _ := v.p.statusDetail()
		for _, u := range s.Upstreams {
			if u.ID == "flaky" && u.LastProbe != nil {
				return u.LastProbe.Result == "fail" && time.Since(u.LastProbe.At) < time.Minute
			}
		}
		return false
	})

	// One request waits behind the held slot: its age shows and grows.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queued := v.p.goChat(ctx, chatBody("chat", false))
	oldest := func() float64 {
		s, _ := v.p.statusDetail()
		for _, m := range s.Models {
			if m.Name == "chat" {
				return m.OldestWaitSeconds
			}
		}
		t.Fatal("no model chat in the status")
		return 0
	}
	eventually(t, 10*time.Second, "the queued request's wait reaches 1 s", func() bool { return oldest() >= 1 })
	page := readAll(t, v.p.adminGet("/llm_route/"))
	if !strings.Contains(page, "1 waiting (of 2), oldest ") {
		t.Errorf("the page does not show the oldest wait")
	}
	cancel()
	<-queued
	eventually(t, 5*time.Second, "the queue empties", func() bool { return oldest() == 0 })
}

// TestFrontsSkipUpstreamsWithoutTheirAPI: a chat request never goes to a
// messages-only upstream (it would answer 404 and be backed off for every
// client); explain says why it is passed over, per front.
func TestFrontsSkipUpstreamsWithoutTheirAPI(t *testing.T) {
	anth := newUpstream(t, nil)
	chat := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "pa", "url", anth.base(), "apis", []string{"messages"}, "auth", "x-api-key"),
			obj("id", "pc", "url", chat.base()),
		},
		[]map[string]any{
			obj("id", "anth", "provider", "pa", "model", "claude-x"),
			obj("id", "local", "provider", "pc", "model", "qwen"),
		},
		[]map[string]any{
			obj("name", "m", "upstreams", []string{"anth", "local"}),
			obj("name", "only-anth", "upstreams", []string{"anth"}),
		},
	))
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Upstream") != "local" {
		t.Fatalf("chat request: %d upstream %q: %s", resp.StatusCode, resp.Header.Get("X-LLM-Route-Upstream"), body)
	}
	if n := len(anth.Calls()); n != 0 {
		t.Errorf("the messages-only upstream got %d chat requests", n)
	}
	resp = p.chat(chatBody("only-anth", false))
	expectAPIError(t, resp, http.StatusServiceUnavailable, "no_upstream_for_api")

	explainAPI := func(model, api string) explainJSON {
		t.Helper()
		resp := p.adminGet("/llm_route/explain?model=" + model + "&api=" + api)
		body := readAll(t, resp)
		var e explainJSON
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &e) != nil {
			t.Fatalf("explain %s %s: %d %s", model, api, resp.StatusCode, body)
		}
		return e
	}
	if e := explainAPI("m", "chat"); e.verdicts() != "anth=api_not_served local=available" || e.Choice == nil || *e.Choice != "local" {
		t.Errorf("explain chat = %+v", e)
	}
	if e := explainAPI("m", "messages"); e.verdicts() != "anth=available local=available" || *e.Choice != "anth" {
		t.Errorf("explain messages = %+v", e)
	}
	if e := explainAPI("only-anth", "responses"); e.verdicts() != "anth=api_not_served" || e.Outcome != "api_not_served" {
		t.Errorf("explain responses on a messages-only model = %+v", e)
	}
	if e := explainAPI("m", "embeddings"); e.Outcome != "api_not_served" || !strings.Contains(e.Upstreams[1].Detail, "does not serve embeddings") {
		t.Errorf("explain embeddings = %+v", e)
	}
	expectAPIError(t, p.adminGet("/llm_route/explain?model=m&api=fax"), http.StatusBadRequest, "invalid_api")
	// A Responses request to local is translated: explain says so.
	if e := explainAPI("m", "responses"); !strings.Contains(e.Upstreams[1].Detail, "translated to chat") {
		t.Errorf("explain responses detail = %+v", e.Upstreams)
	}
}
