package integration

// cache_aware placement against fake inference servers that keep a prompt
// cache and report what they reused as llama.cpp's server does (kvsim): a conversation's later turns reach
// the member that holds its history, with or without a session header;
// a busy warm member is waited for within affinity_wait; a cooling one is
// skipped at once; a member whose report contradicts its index loses it.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llm-route/caddy-llm-route/integration/kvsim"
)

// kvServer starts a fake llama.cpp server with a prompt cache (kvsim):
// slots requests at once, the tokens it reused reported in
// timings.cache_n and usage.prompt_tokens_details.cached_tokens.
func kvServer(t *testing.T, slots int) *kvsim.Server {
	t.Helper()
	s, err := kvsim.Listen(kvsim.Config{Slots: slots, OutputTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// kvServers starts n of them.
func kvServers(t *testing.T, n, slots int) []*kvsim.Server {
	out := make([]*kvsim.Server, n)
	for i := range out {
		out[i] = kvServer(t, slots)
	}
	return out
}

// served is how many chat requests s answered or failed.
func served(s *kvsim.Server) int { return s.Stats().Requests }

// conversation is a coding agent's growing history: a shared system
// prompt, its own task, and a tool result appended every turn.
type conversation struct {
	id   string
	msgs []map[string]any
}

func newConversation(id, system string) *conversation {
	return &conversation{id: id, msgs: []map[string]any{
		{"role": "system", "content": system},
		{"role": "user", "content": "task " + id + ": " + strings.Repeat("fix the parser in "+id+" ", 60)},
	}}
}

// next appends the assistant's last answer and a tool result, and returns
// the turn's body.
func (c *conversation) next(turn int, extra string) string {
	if turn > 0 {
		c.msgs = append(c.msgs,
			map[string]any{"role": "assistant", "content": "running the tests of " + c.id},
			map[string]any{"role": "user", "content": fmt.Sprintf("tool result %d of %s: %s%s", turn, c.id,
				strings.Repeat("ok line "+c.id+" ", 80), extra)})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": c.msgs})
	return string(b)
}

// placementProxy starts a proxy whose model m is one cache_aware pool of
// servers (members g0, g1, …, limit each), then cloud last if given.
func placementProxy(t *testing.T, servers []*kvsim.Server, limit int, pool ...any) *proxy {
	t.Helper()
	var provs, ups []map[string]any
	var ids []string
	for i, s := range servers {
		id := fmt.Sprintf("g%d", i)
		provs = append(provs, obj("id", "p"+id, "url", s.URL+"/v1", "backoff", "30s", "probe_interval", "0s"))
		ups = append(ups, obj("id", id, "provider", "p"+id, "model", "x", "max_concurrency", limit))
		ids = append(ids, id)
	}
	return startProxy(t, cfg(provs, ups, []map[string]any{obj("name", "m", "upstreams", []string{"gpus"}, "queue_size", 16)},
		"pools", []map[string]any{obj(append([]any{"id", "gpus", "upstreams", ids, "placement", "cache_aware"}, pool...)...)}))
}

// send posts one turn and returns the member that answered and the
// placement header.
func send(t *testing.T, p *proxy, body string, hdr ...string) (string, string) {
	t.Helper()
	resp := p.chat(body, hdr...)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp.Header.Get("X-LLM-Route-Upstream"), resp.Header.Get("X-LLM-Route-Placement")
}

// Eight interleaved conversations sharing a system prompt, on three idle
// members: the first turns spread over the members, every later turn goes
// to its conversation's member — with the client's session header, and
// with no header at all (the history's own session) — and the members
// report reusing most of each later prompt.
func TestCacheAwareKeepsEachConversationOnItsMember(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header func(conv string) []string
	}{
		{"session header", func(c string) []string { return []string{"X-Session-Affinity", "s-" + c} }},
		{"no session header", func(string) []string { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			servers := kvServers(t, 3, 2)
			p := placementProxy(t, servers, 2)
			system := "You are a careful coding agent. " + strings.Repeat("Follow the repository's style. ", 40)
			convs := make([]*conversation, 8)
			home := map[string]string{}
			perMember := map[string]int{}
			for i := range convs {
				convs[i] = newConversation(fmt.Sprintf("c%d", i), system)
			}
			for turn := range 5 {
				for _, c := range convs {
					got, placed := send(t, p, c.next(turn, ""), tc.header(c.id)...)
					if turn == 0 {
						home[c.id] = got
						perMember[got]++
						continue
					}
					if got != home[c.id] {
						t.Errorf("turn %d of %s went to %s (%s), its history is on %s", turn, c.id, got, placed, home[c.id])
					}
					if placed != "cache_aware pinned" {
						t.Errorf("turn %d of %s: X-LLM-Route-Placement %q, want cache_aware pinned", turn, c.id, placed)
					}
				}
			}
			for _, id := range []string{"g0", "g1", "g2"} {
				if perMember[id] < 2 {
					t.Errorf("first turns per member %v: want them spread (each at least 2 of 8)", perMember)
				}
			}
			st := poolStatusOf(t, p)
			for _, m := range st.Members {
				if m.CachedRatio == nil || *m.CachedRatio < 0.6 {
					t.Errorf("member %s: cached ratio %v, want most of the prompts reused", m.Upstream, m.CachedRatio)
				}
				if m.Placements["pinned"] == 0 {
					t.Errorf("member %s: placements %v, want pinned ones", m.Upstream, m.Placements)
				}
			}
			if n := p.metric("llm_proxy_placements_total", "pool", "gpus", "upstream", home["c0"], "reason", "pinned"); n < 4 {
				t.Errorf("llm_proxy_placements_total pinned for %s = %v, want c0's 4 later turns at least", home["c0"], n)
			}
			// The completion log names the placement and only a hash of
			// the session.
			pinned := 0
			for _, e := range p.logEntries("request completed") {
				if e["placement"] == "cache_aware pinned" {
					pinned++
				}
				if a, _ := e["affinity"].(string); len(a) != 8 {
					t.Errorf("completion log affinity %q, want an 8-digit hash", a)
				}
			}
			if pinned != 32 {
				t.Errorf("%d completion log lines say cache_aware pinned, want 32", pinned)
			}
			if strings.Contains(p.logs(), "s-c0") {
				t.Error("the log holds a session key")
			}
			// The status page, as rendered on the server.
			resp, err := testClient.Get(p.admin + "/llm_route/")
			if err != nil {
				t.Fatal(err)
			}
			page := readAll(t, resp)
			if !strings.Contains(page, `<td class="pool">gpus (cache_aware)</td>`) || !strings.Contains(page, `<td class="placements">least_busy `) ||
				!strings.Contains(page, ", pinned ") || !strings.Contains(page, ` %</td>`) {
				t.Errorf("the status page does not show the pool's placements and cached ratio:\n%s", page)
			}
		})
	}
}

type poolStatusJSON struct {
	ID        string `json:"id"`
	Placement string `json:"placement"`
	Members   []struct {
		Upstream    string           `json:"upstream"`
		Placements  map[string]int64 `json:"placements"`
		CachedRatio *float64         `json:"cached_ratio"`
	} `json:"members"`
}

func poolStatusOf(t *testing.T, p *proxy) poolStatusJSON {
	t.Helper()
	resp, err := testClient.Get(p.admin + "/llm_route/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pools []poolStatusJSON `json:"pools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Pools) != 1 {
		t.Fatalf("status pools: %v, %+v", err, st.Pools)
	}
	resp.Body.Close()
	return st.Pools[0]
}

// A busy warm member is waited for (affinity_wait) when it frees within
// the wait, and left for a cold member when it does not.
func TestCacheAwareWaitsForABusyWarmMember(t *testing.T) {
	servers := kvServers(t, 3, 1)
	p := placementProxy(t, servers, 1, "affinity_wait", "2s")
	c := newConversation("w", "You are a careful coding agent.")
	hdr := []string{"X-Session-Affinity", "s-w"}
	home, _ := send(t, p, c.next(0, ""), hdr...)
	warm := servers[home[1]-'0']

	// A turn of the same session holds the warm member; the next one waits.
	holdOne := func(turn int) <-chan result {
		warm.Hold()
		ch := p.goChat(context.Background(), c.next(turn, ""), hdr...)
		eventually(t, 10*time.Second, "the warm member busy", func() bool { return warm.Held() == 1 })
		return ch
	}
	held := holdOne(1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		warm.Release()
	}()
	got, placed := send(t, p, c.next(2, ""), hdr...)
	if got != home || !strings.HasPrefix(placed, "cache_aware waited ") {
		t.Errorf("with the warm member freeing within the wait: %s (%s), want %s after a wait", got, placed, home)
	}
	await(t, held)

	// Held past the wait: the turn goes to a cold member after it.
	held = holdOne(3)
	start := time.Now()
	got, placed = send(t, p, c.next(4, ""), hdr...)
	if got == home || placed != "cache_aware cold" {
		t.Errorf("with the warm member held past the wait: %s (%s), want a cold member", got, placed)
	}
	if waited := time.Since(start); waited < 1900*time.Millisecond {
		t.Errorf("left the warm member after %v, want after affinity_wait 2s", waited)
	}
	warm.Release()
	await(t, held)
}

// A cooling warm member is skipped at once, affinity_wait or not.
func TestCacheAwareSkipsACoolingWarmMember(t *testing.T) {
	servers := kvServers(t, 3, 2)
	p := placementProxy(t, servers, 2, "affinity_wait", "5s")
	c := newConversation("k", "You are a careful coding agent.")
	hdr := []string{"X-Session-Affinity", "s-k"}
	home, _ := send(t, p, c.next(0, ""), hdr...)
	warm := servers[home[1]-'0']
	warm.FailNext(100) // loading its model again
	// Other sessions' first turns until one fails on the warm member,
	// which cools it.
	for i := 0; i < 12 && served(warm) < 2; i++ {
		send(t, p, promptBody(fmt.Sprintf("other %d", i)), "X-Session-Affinity", fmt.Sprintf("o%d", i))
	}
	if served(warm) < 2 {
		t.Fatal("no request reached the warm member to cool it")
	}
	start := time.Now()
	got, placed := send(t, p, c.next(1, ""), hdr...)
	if got == home || placed != "cache_aware cold" {
		t.Errorf("warm member cooling: %s (%s), want a cold member", got, placed)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %v: a cooling member is not waited for", d)
	}
}

// A member that reports reusing nothing of what its index predicted loses
// that prefix and the session's pin: the next turn is placed afresh.
func TestCacheAwareForgetsWhatAMemberDidNotHold(t *testing.T) {
	servers := kvServers(t, 3, 2)
	p := placementProxy(t, servers, 2)
	c := newConversation("z", "You are a careful coding agent.")
	hdr := []string{"X-Session-Affinity", "s-z"}
	home, _ := send(t, p, c.next(0, ""), hdr...)
	warm := servers[home[1]-'0']
	if got, placed := send(t, p, c.next(1, ""), hdr...); got != home || placed != "cache_aware pinned" {
		t.Fatalf("turn 1: %s (%s), want pinned to %s", got, placed, home)
	}
	warm.DropCache() // restarted meanwhile: turn 2 reuses nothing
	if got, _ := send(t, p, c.next(2, ""), hdr...); got != home {
		t.Fatalf("turn 2 went to %s, want still pinned to %s", got, home)
	}
	// Explain sees the session's next turn: no pin, no warm prefix there.
	body := c.next(3, "")
	resp, err := testClient.Post(p.admin+"/llm_route/explain?session=s-z", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		Upstreams []struct {
			ID        string `json:"id"`
			Placement *struct {
				Rank   int    `json:"rank"`
				Reason string `json:"reason"`
			} `json:"placement"`
		} `json:"upstreams"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ex); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, u := range ex.Upstreams {
		if u.Placement == nil {
			t.Fatalf("explain: member %s has no placement", u.ID)
		}
		if u.ID == home && (u.Placement.Reason == "pinned" || strings.HasPrefix(u.Placement.Reason, "warm")) {
			t.Errorf("explain after the contradicting report: %s still %s", home, u.Placement.Reason)
		}
	}
	if _, placed := send(t, p, body, hdr...); placed == "cache_aware pinned" || strings.HasPrefix(placed, "cache_aware warm") {
		t.Errorf("turn 3 after the contradicting report: %s, want placed afresh", placed)
	}
}

// Explain ranks a pool's members for a session and for a POSTed body, and
// names the key only by a short hash; a session the pool has not seen
// whose history a member holds finds it warm through the prefix index.
func TestExplainRanksPoolMembers(t *testing.T) {
	servers := kvServers(t, 2, 2)
	p := placementProxy(t, servers, 2)
	c := newConversation("e", "You are a careful coding agent.")
	turn0 := c.next(0, "")
	home, _ := send(t, p, turn0, "X-Session-Affinity", "secret-session-e")
	for _, req := range []func() (*http.Response, error){
		func() (*http.Response, error) {
			return testClient.Get(p.admin + "/llm_route/explain?model=m&session=secret-session-e")
		},
		func() (*http.Response, error) {
			r, _ := http.NewRequest(http.MethodPost, p.admin+"/llm_route/explain", strings.NewReader(c.next(1, "")))
			r.Header.Set("X-Session-Affinity", "secret-session-e")
			return testClient.Do(r)
		},
	} {
		resp, err := req()
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(raw), "secret-session-e") {
			t.Errorf("explain shows the affinity key itself: %s", raw)
		}
		var ex struct {
			Affinity  string `json:"affinity"`
			Upstreams []struct {
				ID        string `json:"id"`
				Placement *struct {
					Pool   string `json:"pool"`
					Rank   int    `json:"rank"`
					Reason string `json:"reason"`
				} `json:"placement"`
			} `json:"upstreams"`
		}
		if err := json.Unmarshal(raw, &ex); err != nil || len(ex.Upstreams) != 2 {
			t.Fatalf("explain: %v %s", err, raw)
		}
		first := ex.Upstreams[0]
		if len(ex.Affinity) != 8 || first.ID != home || first.Placement == nil || first.Placement.Rank != 1 ||
			first.Placement.Reason != "pinned" || first.Placement.Pool != "gpus" {
			t.Errorf("explain: %s, want %s ranked 1 pinned in pool gpus, and an 8-digit affinity hash", raw, home)
		}
	}
	// Another session with the same history: no pin, the prefix index.
	r, _ := http.NewRequest(http.MethodPost, p.admin+"/llm_route/explain", strings.NewReader(turn0))
	r.Header.Set("X-Session-Affinity", "a-fork")
	resp, err := testClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(raw2s(raw), `{"id":"`+home+`","verdict":"available","detail":"would take it, 0/2 slots in use","placement":{"pool":"gpus","rank":1,"reason":"warm 1.00"}`) {
		t.Errorf("explain of a new session with a known history: %s, want %s ranked 1 warm", raw, home)
	}
}

func raw2s(b []byte) string { return string(b) }

// The sessions recorded from Claude Code (x-claude-code-session-id) and
// Codex (session-id, prompt_cache_key), and opencode's x-session-affinity:
// each client's session stays on one member, and different sessions of
// the same client spread.
func TestCacheAwarePinsRecordedClientSessions(t *testing.T) {
	type recorded struct {
		Requests []struct {
			URL     string            `json:"url"`
			Headers map[string]string `json:"headers"`
			Body    json.RawMessage   `json:"body"`
		} `json:"requests"`
	}
	load := func(name string) (string, map[string]string, []byte) {
		raw, err := os.ReadFile("testdata/clients/" + name)
		if err != nil {
			t.Fatal(err)
		}
		var r recorded
		if err := json.Unmarshal(raw, &r); err != nil || len(r.Requests) == 0 {
			t.Fatalf("%s: %v", name, err)
		}
		q := r.Requests[0]
		return q.URL, q.Headers, q.Body
	}
	opencode := []byte(`{"model":"m","messages":[{"role":"system","content":"You are opencode, an interactive CLI tool."},{"role":"user","content":"list the files"}],"stream":false}`)
	for _, tc := range []struct {
		name, file, path, header string
	}{
		{"claude code", "claude-code-2.1.328.messages.json", "/v1/messages", "x-claude-code-session-id"},
		{"codex", "codex-0.169.0.responses.json", "/v1/responses", "session-id"},
		{"opencode", "", "/v1/chat/completions", "x-session-affinity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			servers := kvServers(t, 3, 4)
			p := placementProxy(t, servers, 4)
			hdrs, body := map[string]string{}, opencode
			if tc.file != "" {
				_, hdrs, body = load(tc.file)
			}
			var m map[string]any
			_ = json.Unmarshal(body, &m)
			m["model"], m["stream"] = "m", false
			body, _ = json.Marshal(m)
			post := func(session string) string {
				r, _ := http.NewRequest(http.MethodPost, p.URL+tc.path, strings.NewReader(string(body)))
				for k, v := range hdrs {
					if !strings.EqualFold(k, "content-length") && !strings.EqualFold(k, "host") && !strings.EqualFold(k, "accept-encoding") {
						r.Header.Set(k, v)
					}
				}
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set(tc.header, session)
				resp, err := testClient.Do(r)
				if err != nil {
					t.Fatal(err)
				}
				if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				return resp.Header.Get("X-LLM-Route-Upstream")
			}
			home := post("session-one")
			for i := range 5 {
				if got := post("session-one"); got != home {
					t.Errorf("request %d of one session went to %s, the session is on %s", i, got, home)
				}
			}
			seen := map[string]bool{}
			for i := range 6 {
				seen[post(fmt.Sprintf("session-%d", i+2))] = true
			}
			if len(seen) < 2 {
				t.Errorf("six sessions all went to %v: sessions should spread", seen)
			}
		})
	}
}

// Two Caddy processes on one Redis: a conversation whose turns alternate
// between them stays on one member (the pin is shared; each process's
// prefix index is its own).
func TestCacheAwarePinSharedThroughRedis(t *testing.T) {
	rs := startRedis(t)
	servers := kvServers(t, 3, 2)
	var provs, ups []map[string]any
	for i, s := range servers {
		id := fmt.Sprintf("g%d", i)
		provs = append(provs, obj("id", "p"+id, "url", s.URL+"/v1"))
		ups = append(ups, obj("id", id, "provider", "p"+id, "model", "x", "max_concurrency", 2))
	}
	conf := cfg(provs, ups, []map[string]any{obj("name", "m", "upstreams", []string{"gpus"})},
		"pools", []map[string]any{obj("id", "gpus", "upstreams", []string{"g0", "g1", "g2"}, "placement", "cache_aware")},
		"state", obj("backend", "redis", "address", rs.addr, "prefix", "pin:"))
	a, b := startInstance(t, conf), startInstance(t, conf)
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)
	rc := rs.client()
	defer rc.Close()
	pins := 0
	for _, c := range []*conversation{newConversation("r1", "You are a careful coding agent."), newConversation("r2", "You are a careful coding agent.")} {
		hdr := []string{"X-Session-Affinity", "s-" + c.id}
		home := ""
		for turn := range 6 {
			in := a.proxy
			if turn%2 == 1 {
				in = b.proxy
			}
			got, placed := send(t, in, c.next(turn, ""), hdr...)
			if turn == 0 {
				home = got
				// The pin is written when the first turn settles, which
				// may be a moment after its answer reached the client; a
				// real agent's next turn comes seconds later.
				pins++
				eventually(t, 5*time.Second, "the first turn's pin in Redis", func() bool {
					keys, _ := rc.Keys(context.Background(), "pin:aff:gpus:*").Result()
					return len(keys) == pins
				})
			} else if got != home || placed != "cache_aware pinned" {
				t.Errorf("%s turn %d on instance %d: %s (%s), want pinned to %s", c.id, turn, turn%2, got, placed, home)
			}
		}
	}
}

// `caddy llm-route explain --session` ranks a pool's members for the key
// and shows each one's place and reason, and only the key's hash.
func TestCLIExplainSession(t *testing.T) {
	servers := kvServers(t, 2, 2)
	p := placementProxy(t, servers, 2)
	c := newConversation("cli", "You are a careful coding agent.")
	home, _ := send(t, p, c.next(0, ""), "X-Session-Affinity", "cli-secret-session")
	out, err := runCLI(t, "explain", "m", "--address", strings.TrimPrefix(p.admin, "http://"), "--session", "cli-secret-session")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	if !strings.Contains(out, "1  "+home+" ") || !strings.Contains(out, "[pool gpus #1: pinned]") ||
		!strings.Contains(out, "[pool gpus #2: least_busy]") || !strings.Contains(out, "(affinity key ") {
		t.Errorf("explain --session output:\n%s\nwant %s first and pinned, the other second, the key's hash", out, home)
	}
	if strings.Contains(out, "cli-secret-session") {
		t.Errorf("explain printed the affinity key:\n%s", out)
	}
}
