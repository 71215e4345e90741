package integration

// Issue 16, the session registry shared through Redis: with
// the redis state, a conversation's session id is the same whichever
// instance serves its next turn.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Turns of one conversation, and a second conversation. Turn 1's id is the
// hash of its history on any instance; every later id is the registry's.
var (
	sessTurn1 = `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"}]}`
	sessTurn2 = `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"},` +
		`{"role":"assistant","content":"Day 1: Colosseum"},{"role":"user","content":"And day 2?"}]}`
	sessTurn3 = `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"},` +
		`{"role":"assistant","content":"Day 1: Colosseum"},{"role":"user","content":"And day 2?"},{"role":"assistant","content":"Vatican"},{"role":"user","content":"Day 3?"}]}`
	// Turn 2 edited: only turn 1's prefix is shared with what came before.
	sessEdited = `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"},` +
		`{"role":"assistant","content":"Day 1: Colosseum"},{"role":"user","content":"Make it cheaper"}]}`
	sessTurn4 = `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"},` +
		`{"role":"assistant","content":"Day 1: Colosseum"},{"role":"user","content":"And day 2?"},{"role":"assistant","content":"Vatican"},` +
		`{"role":"user","content":"Day 3?"},{"role":"assistant","content":"Trastevere"},{"role":"user","content":"Day 4?"}]}`
	sessOther = `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Write a haiku"}]}`
)

// sessionConfig is fleetConfig with the provider's session header set.
func sessionConfig(up *fakeUpstream, addr string, state ...any) map[string]any {
	conf := fleetConfig(up, addr, 8, state...)
	conf["providers"].([]map[string]any)[0]["session_header"] = "X-Session"
	return conf
}

// sessionOf sends body to p and returns the session header the upstream
// got, checking the request was served within a second.
func sessionOf(t *testing.T, p *proxy, up *fakeUpstream, body string) string {
	t.Helper()
	n := len(up.Calls())
	start := time.Now()
	resp := p.chat(body)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s", resp.StatusCode, b)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("request took %v; every Redis call is bounded by the 50ms timeout", d)
	}
	calls := up.Calls()
	if len(calls) != n+1 {
		t.Fatalf("upstream calls %d → %d, want one more", n, len(calls))
	}
	id := calls[n].Header.Get("X-Session")
	if id == "" {
		t.Fatal("no session header on the upstream request")
	}
	return id
}

func TestFleetSessionIDSameOnEveryInstance(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	a := startInstance(t, sessionConfig(up, rs.addr))
	b := startInstance(t, sessionConfig(up, rs.addr))
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)

	id := sessionOf(t, a.proxy, up, sessTurn1)
	// Instance b never saw turn 1: alone it would name turn 2 by its whole
	// history, and the edit by its own.
	for _, step := range []struct {
		name string
		in   *instance
		body string
	}{
		{"turn 2 on b", b, sessTurn2},
		{"turn 3 on a", a, sessTurn3},
		{"turn 2 edited, on b", b, sessEdited},
	} {
		if got := sessionOf(t, step.in.proxy, up, step.body); got != id {
			t.Errorf("%s: session %q, want turn 1's %q", step.name, got, id)
		}
	}
	other := sessionOf(t, b.proxy, up, sessOther)
	if other == id {
		t.Errorf("another conversation got the same id %q", id)
	}
	// The registry lives under the state prefix.
	c := rs.client()
	defer c.Close()
	if keys := c.Keys(context.Background(), "t:sess:*").Val(); len(keys) != 7 {
		// Turn 3's five messages from the first user one, the edited turn's
		// last one, the other conversation's one.
		t.Errorf("Redis holds %d session keys under t:sess:, want 7", len(keys))
	}

	// Redis stopped: still served, within the bound, and each instance
	// answers from its own registry, which kept the shared ids.
	rs.stop()
	if got := sessionOf(t, a.proxy, up, sessTurn4); got != id {
		t.Errorf("turn 4 on a with Redis stopped: %q, want %q from a's own registry", got, id)
	}
	if got := sessionOf(t, b.proxy, up, sessOther); got != other {
		t.Errorf("the other conversation on b with Redis stopped: %q, want %q", got, other)
	}
	newID := sessionOf(t, b.proxy, up, `{"model":"m","messages":[{"role":"user","content":"Started while Redis was away"}]}`)
	if newID == id || newID == other {
		t.Errorf("a new conversation with Redis stopped got an existing id %q", newID)
	}
	for name, in := range map[string]*instance{"a": a, "b": b} {
		eventually(t, 10*time.Second, name+" counting the state errors", func() bool {
			return in.metric("llm_proxy_state_errors_total") >= 1
		})
	}
}

// Under on_state_error reject a session call that fails still serves the
// request, with the local id: here Redis refuses the session keys (an ACL)
// while the slot scripts work.
func TestFleetSessionFailureIsNeverA503(t *testing.T) {
	rs := startRedis(t)
	c := rs.client()
	defer c.Close()
	if err := c.Do(context.Background(), "ACL", "SETUSER", "llm", "on", ">pw", "~t:up:*", "~t:prov:*", "~t:backoff:*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, nil)
	p := startProxy(t, sessionConfig(up, rs.addr, "on_state_error", "reject", "username", "llm", "password", "pw"))
	eventually(t, 10*time.Second, "redis state healthy", func() bool {
		_, body := p.status()
		return strings.Contains(body, `"state":{"backend":"redis","healthy":true}`)
	})
	before := p.metric("llm_proxy_state_errors_total")
	id1 := sessionOf(t, p, up, sessTurn1)
	id2 := sessionOf(t, p, up, sessTurn2)
	if id1 != id2 {
		t.Errorf("the local registry did not keep the conversation's id: %q then %q", id1, id2)
	}
	if n := p.metric("llm_proxy_state_errors_total") - before; n < 2 {
		t.Errorf("state errors counted %v, want the 2 refused session calls", n)
	}
	if n := len(p.logEntries("shared session registry unreachable, session ids from this instance's registry")); n != 1 {
		t.Errorf("ERROR entries for the session registry = %d, want exactly 1 (once per transition)", n)
	}
	// The claims still work: the instance is not switched to reject.
	if _, body := p.status(); !strings.Contains(body, `"state":{"backend":"redis","healthy":true}`) {
		t.Errorf("a failed session call switched the state to its fallback: %s", body)
	}
	if k := c.Keys(context.Background(), "t:sess:*").Val(); len(k) != 0 {
		t.Errorf("session keys written despite the ACL: %v", k)
	}
}

// An id in Redis that is no header value (a Redis written to by someone
// else) is not sent: the request is served with the local registry's id.
func TestFleetSessionBadIDFromRedisIsNotSent(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	p := startProxy(t, sessionConfig(up, rs.addr))
	eventually(t, 10*time.Second, "redis state healthy", func() bool {
		_, body := p.status()
		return strings.Contains(body, `"state":{"backend":"redis","healthy":true}`)
	})
	id := sessionOf(t, p, up, sessTurn1)
	c := rs.client()
	defer c.Close()
	if err := c.Set(context.Background(), "t:sess:"+id, "1700000000 evil\r\nX-Injected: 1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if got := sessionOf(t, p, up, sessTurn2); got != id {
		t.Errorf("turn 2: session %q, want the local registry's %q", got, id)
	}
	calls := up.Calls()
	if h := calls[len(calls)-1].Header.Get("X-Injected"); h != "" {
		t.Errorf("a header was injected through the registry: %q", h)
	}
}
