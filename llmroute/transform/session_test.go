package transform

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is an injectable clock for TTL tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func body(msgs ...string) []byte {
	return []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `]}`)
}

const (
	sys   = `{"role":"system","content":"You are helpful."}`
	u1    = `{"role":"user","content":"Plan a trip to Kyoto"}`
	a1    = `{"role":"assistant","content":"Sure. When?"}`
	u2    = `{"role":"user","content":"In April"}`
	a2    = `{"role":"assistant","content":"Cherry blossom season!"}`
	u3    = `{"role":"user","content":"Budget?"}`
	other = `{"role":"user","content":"Fix my Go build"}`
)

func TestSessionsConversation(t *testing.T) {
	s := NewSessions(1000, 6*time.Hour, nil)
	id1 := s.ID(body(sys, u1))
	if len(id1) != 32 {
		t.Fatalf("id %q", id1)
	}
	if id := s.ID(body(sys, u1, a1, u2)); id != id1 {
		t.Fatalf("turn 2 got %s want %s", id, id1)
	}
	if id := s.ID(body(sys, u1, a1, u2, a2, u3)); id != id1 {
		t.Fatalf("turn 3 got %s want %s", id, id1)
	}
	idB := s.ID(body(sys, other))
	if idB == id1 {
		t.Fatal("different conversation got the same id")
	}
	if id := s.ID(body(sys, other, a1, u2)); id != idB {
		t.Fatal("second conversation lost its id")
	}
	// Regenerated / edited last turn still matches.
	if id := s.ID(body(sys, u1, a1, `{"role":"user","content":"In May instead"}`)); id != id1 {
		t.Fatal("edited last turn lost the session")
	}
	// The system prompt is ignored.
	if id := s.ID(body(`{"role":"system","content":"Different prompt"}`, u1, a1, u2)); id != id1 {
		t.Fatal("system prompt changed the id")
	}
	if id := s.ID(body(u1, a1, u2)); id != id1 {
		t.Fatal("dropping the system prompt changed the id")
	}
	if s.Len() != 2 {
		t.Fatalf("Len = %d", s.Len())
	}
}

func TestSessionsCanonicalForm(t *testing.T) {
	s := NewSessions(1000, time.Hour, nil)
	base := s.ID(body(sys, u1, a1, u2))
	// Each variant must land in the same session as base; the registry
	// resolves by the longest known prefix, so check against a fresh registry
	// too: the whole-history hash must be equal, not just a prefix.
	variants := []string{
		// Key order, whitespace, escapes.
		string(body(sys, `{ "content" : "Plan a trip to Kyoto" , "role" : "user" }`, `{"content":"Sure. When?","role":"assistant"}`, `{"role":"user","content":"In \u0041pril"}`)),
		// Reasoning fields added by clients or by our backfill.
		string(body(sys, u1, `{"role":"assistant","content":"Sure. When?","reasoning":"think","reasoning_content":"think","reasoning_details":[{"type":"reasoning.text","text":"think"}]}`, u2)),
		// Content as text parts, with cache_control, and trimmed whitespace.
		string(body(sys, `{"role":"user","content":[{"type":"text","text":"Plan a trip ","cache_control":{"type":"ephemeral"}},{"type":"text","text":"to Kyoto"}]}`, `{"role":"assistant","content":"\n\nSure. When?  "}`, u2)),
		// Unknown fields ignored.
		string(body(sys, u1, `{"role":"assistant","content":"Sure. When?","refusal":null,"annotations":[]}`, u2)),
	}
	fresh := NewSessions(1000, time.Hour, nil)
	baseFresh := fresh.ID(body(sys, u1, a1, u2))
	for i, v := range variants {
		if id := s.ID([]byte(v)); id != base {
			t.Errorf("variant %d: %s != %s", i, id, base)
		}
		if id := NewSessions(10, time.Hour, nil).ID([]byte(v)); id != baseFresh {
			t.Errorf("variant %d: whole-history hash differs", i)
		}
	}
	// Things that do identify a turn.
	different := []string{
		string(body(sys, `{"role":"user","content":"Plan a trip to Kyoto!"}`)),
		string(body(sys, `{"role":"user","content":"Plan a trip to Kyoto","name":"bob"}`)),
		string(body(sys, u1, `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}`)),
		string(body(sys, u1, `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"g","arguments":"{}"}}]}`)),
		string(body(sys, u1, `{"role":"tool","tool_call_id":"c2","content":"x"}`)),
		string(body(sys, `{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/1.png"}}]}`)),
		string(body(sys, `{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/2.png"}}]}`)),
	}
	seen := map[string]int{}
	for i, d := range different {
		id := NewSessions(10, time.Hour, nil).ID([]byte(d))
		if j, ok := seen[id]; ok {
			t.Errorf("bodies %d and %d share id", i, j)
		}
		seen[id] = i
	}
	// Image parts: key order and cache_control don't matter.
	a := NewSessions(10, time.Hour, nil).ID(body(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/1.png","detail":"low"}}]}`))
	b := NewSessions(10, time.Hour, nil).ID(body(`{"role":"user","content":[{"image_url":{"detail":"low","url":"https://x/1.png"},"type":"image_url","cache_control":{"type":"ephemeral"}}]}`))
	if a != b {
		t.Error("image part canonical form depends on key order")
	}
}

func TestSessionsNoUserOrMessages(t *testing.T) {
	s := NewSessions(10, time.Hour, nil)
	for _, b := range []string{``, `not json`, `{}`, `{"messages":[]}`, `{"messages":"x"}`, `[1,2]`} {
		if id := s.ID([]byte(b)); len(id) != 32 {
			t.Errorf("ID(%q) = %q", b, id)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("bodies without messages were recorded: %d", s.Len())
	}
	// Only a system message: chained from it, recorded.
	id := s.ID(body(sys))
	if id == "" || s.ID(body(sys)) != id || s.Len() != 1 {
		t.Fatal("system-only history")
	}
	// Different bodies without messages get different ids.
	if s.ID([]byte(`{"a":1}`)) == s.ID([]byte(`{"a":2}`)) {
		t.Fatal("no-messages ids collide")
	}
}

func TestSessionsLRU(t *testing.T) {
	s := NewSessions(3, time.Hour, nil)
	conv := func(i int) []byte { return body(fmt.Sprintf(`{"role":"user","content":"conversation %d"}`, i)) }
	ids := make([]string, 5)
	for i := 0; i < 3; i++ {
		ids[i] = s.ID(conv(i))
	}
	s.ID(conv(0)) // touch 0: 1 is now least recently used
	ids[3] = s.ID(conv(3))
	if s.Len() != 3 {
		t.Fatalf("Len = %d", s.Len())
	}
	// 0 and 2 survive: a continuation keeps its id.
	if s.ID(body(`{"role":"user","content":"conversation 0"}`, a1, u2)) != ids[0] {
		t.Fatal("recently used session evicted")
	}
	if s.ID(body(`{"role":"user","content":"conversation 2"}`, a1, u2)) != ids[2] {
		t.Fatal("session 2 evicted")
	}
	// 1 was evicted with its prefixes: its continuation starts a new session.
	if id := s.ID(body(`{"role":"user","content":"conversation 1"}`, a1, u2)); id == ids[1] {
		t.Fatal("evicted session still matched")
	}
	if len(s.byPrefix) > 3*maxPrefixesPerSession {
		t.Fatalf("prefix map holds %d entries", len(s.byPrefix))
	}
	// Every map entry belongs to a live session.
	live := map[*session]bool{}
	for x := s.head; x != nil; x = x.succ {
		live[x] = true
	}
	for _, sess := range s.byPrefix {
		if !live[sess] {
			t.Fatal("prefix of an evicted session left behind")
		}
	}
}

func TestSessionsTTL(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s := NewSessions(100, 6*time.Hour, clk.now)
	id := s.ID(body(u1))
	clk.advance(5 * time.Hour)
	if s.ID(body(u1, a1, u2)) != id {
		t.Fatal("expired too early")
	}
	clk.advance(5 * time.Hour) // 5h after last use: still alive (sliding TTL)
	if s.ID(body(u1, a1, u2, a2, u3)) != id {
		t.Fatal("TTL not sliding")
	}
	clk.advance(6*time.Hour + time.Second)
	if got := s.ID(body(u1, a1, u2, a2, u3, a1)); got == id {
		t.Fatal("expired session matched")
	}
	if s.Len() != 1 {
		t.Fatalf("expired session not removed: Len=%d", s.Len())
	}
}

func TestSessionsPrefixCap(t *testing.T) {
	s := NewSessions(10, time.Hour, nil)
	msgs := []string{u1}
	for i := 0; i < 300; i++ {
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"a%d"}`, i), fmt.Sprintf(`{"role":"user","content":"u%d"}`, i))
	}
	id := s.ID(body(msgs...))
	if len(s.byPrefix) != maxPrefixesPerSession {
		t.Fatalf("%d prefixes recorded", len(s.byPrefix))
	}
	// Growing keeps the id and the cap.
	msgs = append(msgs, a1, u2)
	if s.ID(body(msgs...)) != id || len(s.byPrefix) != maxPrefixesPerSession {
		t.Fatalf("growth: %d prefixes", len(s.byPrefix))
	}
	// Editing a turn within the last 128 still matches.
	edited := append(append([]string(nil), msgs[:len(msgs)-100]...), `{"role":"user","content":"edited"}`)
	if s.ID(body(edited...)) != id {
		t.Fatal("recent edit lost the session")
	}
}

func TestSessionsConcurrent(t *testing.T) {
	clk := &fakeClock{t: time.Unix(0, 0)}
	s := NewSessions(50, time.Minute, clk.now)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				conv := fmt.Sprintf(`{"role":"user","content":"g%d c%d"}`, g, i%70)
				id := s.ID(body(conv, a1, u2))
				if len(id) != 32 {
					t.Error("bad id")
					return
				}
				if i%50 == 0 {
					clk.advance(10 * time.Second)
					s.Len()
				}
			}
		}(g)
	}
	wg.Wait()
	if n := s.Len(); n > 50 {
		t.Fatalf("Len %d > max", n)
	}
}

// History, Record and Resolve are the registry's halves for a shared
// registry kept elsewhere: the same hashes and candidate as ID, and an id
// chosen elsewhere answered locally afterwards.
func TestSessionsHistoryRecordResolve(t *testing.T) {
	turn1, turn2 := body(sys, u1), body(sys, u1, a1, u2)
	h1, h2 := NewHistory(turn1), NewHistory(turn2)
	if want := NewSessions(10, time.Hour, nil).ID(turn1); h1.Candidate != want {
		t.Fatalf("candidate %q, want the id ID gives a new session %q", h1.Candidate, want)
	}
	keys := h2.Keys(nil, "p:")
	if len(keys) != 3 || keys[0] != "p:"+h2.Candidate || !strings.HasPrefix(keys[2], "p:") {
		t.Fatalf("keys of a three-message history: %q (want 3, longest first, the candidate's hash first)", keys)
	}
	if k1 := h1.Keys(nil, "p:"); len(k1) != 1 || k1[0] != keys[2] {
		t.Errorf("turn 1's key %q is not turn 2's shortest %q", k1, keys[2])
	}

	// An id chosen elsewhere for turn 2 is what the local registry answers
	// for turn 2 and for what grows from it, even though turn 1 was named
	// otherwise here.
	s := NewSessions(10, time.Hour, nil)
	local := s.ID(turn1)
	s.Record(h2, "shared")
	if got := s.Resolve(h2); got != "shared" {
		t.Errorf("resolve after record = %q, want shared", got)
	}
	if got := s.ID(body(sys, u1, a1, u2, a2, u3)); got != "shared" {
		t.Errorf("the next turn = %q, want shared", got)
	}
	if got := s.ID(turn1); got != "shared" {
		t.Errorf("turn 1 again = %q, want shared (its prefix moved; was %q)", got, local)
	}
	if s.Len() != 2 {
		t.Errorf("sessions = %d, want 2 (the local one lingers until evicted)", s.Len())
	}

	// A body without messages: its hash, nothing recorded.
	empty := NewHistory([]byte(`{"model":"m"}`))
	if !empty.Empty() || empty.Candidate == "" || len(empty.Keys(nil, "")) != 0 {
		t.Errorf("history of a body without messages: %+v", empty)
	}
	s.Record(empty, "x")
	if got := s.Resolve(empty); got != empty.Candidate {
		t.Errorf("resolve of a body without messages = %q, want its hash", got)
	}

	// Keys stop at the 128 most recent prefixes.
	msgs := []string{u1}
	for i := 0; i < 200; i++ {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"m%d"}`, i))
	}
	if n := len(NewHistory(body(msgs...)).Keys(nil, "")); n != maxPrefixesPerSession {
		t.Errorf("keys of a 201-message history = %d, want %d", n, maxPrefixesPerSession)
	}
}

// FuzzSessionsHistory: NewHistory agrees with ID (the candidate is what a
// fresh registry names the body), never panics, and an id recorded for a
// history is what Resolve answers for it afterwards.
func FuzzSessionsHistory(f *testing.F) {
	f.Add([]byte(body(sys, u1, a1, u2)))
	f.Add([]byte(`{"messages":[1,"x",null,{"role":"user"}]}`))
	f.Add([]byte(`{"model":"m"}`))
	s := NewSessions(8, 0, nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		h := NewHistory(b)
		if want := NewSessions(8, 0, nil).ID(b); h.Candidate != want {
			t.Fatalf("candidate %q, ID %q", h.Candidate, want)
		}
		if n := len(h.Keys(nil, "")); n > maxPrefixesPerSession || (n == 0) != h.Empty() {
			t.Fatalf("%d keys, empty %v", n, h.Empty())
		}
		s.Record(h, "chosen-elsewhere")
		if got := s.Resolve(h); !h.Empty() && got != "chosen-elsewhere" {
			t.Fatalf("resolve after record = %q", got)
		}
	})
}

func TestValidHeaderValue(t *testing.T) {
	for s, want := range map[string]bool{
		"": true, "sess-1": true, "a\tb": true, "caf\xc3\xa9": true,
		"a\r\nX-Evil: 1": false, "a\nb": false, "a\x00b": false, "a\x7fb": false,
	} {
		if got := ValidHeaderValue(s); got != want {
			t.Errorf("ValidHeaderValue(%q) = %v, want %v", s, got, want)
		}
	}
}
