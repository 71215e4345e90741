package placement

import (
	"bytes"
	"fmt"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: HashString("m" + strconv.Itoa(i)), Limit: 4}
	}
	return ms
}

func rank(p *Pool, ms []Member, req Request) ([]int, []Reason, Decision) {
	order, reasons := make([]int, len(ms)), make([]Reason, len(ms))
	d := p.Rank(ms, req, order, reasons)
	return order, reasons, d
}

func TestFirstKeepsListOrderSkippingBusyAndCooling(t *testing.T) {
	ms := members(3)
	p := &Pool{Policy: First}
	if o, r, _ := rank(p, ms, Request{}); fmt.Sprint(o) != "[0 1 2]" || r[0].String() != "first" {
		t.Fatalf("order %v reasons %v, want [0 1 2] first", o, r)
	}
	ms[0].Cooling, ms[1].InFlight = true, 4
	if o, _, _ := rank(p, ms, Request{}); fmt.Sprint(o) != "[2 1 0]" {
		t.Fatalf("cooling 0, busy 1: order %v, want [2 1 0] (free, busy, cooling)", o)
	}
}

func TestLeastBusyIdleEqualsAlternate(t *testing.T) {
	ms := members(3)
	p := &Pool{}
	seen := map[int]int{}
	for range 30 {
		o, r, _ := rank(p, ms, Request{})
		if r[0].Kind != KindLeastBusy {
			t.Fatalf("reason %v, want least_busy", r[0])
		}
		seen[o[0]]++
	}
	if seen[0] != 10 || seen[1] != 10 || seen[2] != 10 {
		t.Fatalf("first choices over 30 idle decisions %v, want 10 each", seen)
	}
}

func TestLeastBusyLoadOrder(t *testing.T) {
	ms := members(3)
	ms[0].InFlight = 1                 // 1/4
	ms[1].InFlight, ms[1].Limit = 1, 2 // 1/2
	ms[2].InFlight, ms[2].Limit = 0, 0 // no limit, idle
	p := &Pool{}
	for range 5 {
		if o, _, _ := rank(p, ms, Request{}); fmt.Sprint(o) != "[2 0 1]" {
			t.Fatalf("order %v, want [2 0 1] by load 0, 0.25, 0.5", o)
		}
	}
	ms[2].InFlight = 3 // no limit: load 3
	ms[1].InFlight = 2 // full: busy
	if o, _, _ := rank(p, ms, Request{}); fmt.Sprint(o) != "[0 2 1]" {
		t.Fatalf("order %v, want [0 2 1] (0.25, 3, busy)", o)
	}
}

func TestStickyKeyKeepsItsMember(t *testing.T) {
	ms := members(3)
	p := &Pool{Policy: Sticky}
	key := HashString("session-a")
	o, r, _ := rank(p, ms, Request{Key: key, HasKey: true})
	want := fmt.Sprint(o)
	if r[0].String() != "weighted" {
		t.Fatalf("reason %v, want weighted", r[0])
	}
	for i := range 50 {
		ms[i%3].InFlight = int64(i % 3) // load changes do not move a key
		if o, _, _ := rank(p, ms, Request{Key: key, HasKey: true}); fmt.Sprint(o) != want {
			t.Fatalf("call %d: order %v, want %v", i, o, want)
		}
	}
}

func TestStickyWeights90To10(t *testing.T) {
	ms := members(2)
	ms[0].Weight, ms[1].Weight = 90, 10
	p := &Pool{Policy: Sticky}
	first := 0
	for k := range 1000 {
		if o, _, _ := rank(p, ms, Request{Key: HashString("user-" + strconv.Itoa(k)), HasKey: true}); o[0] == 0 {
			first++
		}
	}
	if first < 870 || first > 930 {
		t.Fatalf("%d of 1000 keys on the weight-90 member, want 900 ± 30", first)
	}
}

func TestStickyBusyOrCoolingFirstHandsToNextRanked(t *testing.T) {
	ms := members(4)
	p := &Pool{Policy: Sticky}
	req := Request{Key: HashString("k"), HasKey: true}
	o, _, _ := rank(p, ms, req)
	top, second := o[0], o[1]
	ms[top].InFlight = ms[top].Limit
	if o2, _, _ := rank(p, ms, req); o2[0] != second || o2[len(o2)-1] != top {
		t.Fatalf("busy top %d: order %v, want %d first and %d last", top, o2, second, top)
	}
	ms[top].InFlight, ms[top].Cooling = 0, true
	if o2, _, _ := rank(p, ms, req); o2[0] != second {
		t.Fatalf("cooling top %d: order %v, want %d first", top, o2, second)
	}
}

// TestStickyRemovalMovesOnlyItsKeys: over random member sets and weights,
// removing one member moves exactly the keys it held (each to its own
// next-ranked member), which is its weighted share within a tolerance.
func TestStickyRemovalMovesOnlyItsKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := &Pool{Policy: Sticky}
	const keys = 2000
	for trial := range 40 {
		n := 2 + rng.IntN(7)
		ms := make([]Member, n)
		total := 0
		for i := range ms {
			ms[i] = Member{ID: HashString(fmt.Sprintf("t%d-m%d", trial, i)), Weight: uint32(1 + rng.IntN(10))}
			total += int(ms[i].Weight)
		}
		gone := rng.IntN(n)
		rest := append(append([]Member{}, ms[:gone]...), ms[gone+1:]...)
		moved := 0
		for k := range keys {
			req := Request{Key: HashString(fmt.Sprintf("t%d-k%d", trial, k)), HasKey: true}
			before, _, _ := rank(p, ms, req)
			after, _, _ := rank(p, rest, req)
			if rest[after[0]].ID != ms[before[0]].ID {
				moved++
				if before[0] != gone {
					t.Fatalf("trial %d: a key of member %d moved when %d was removed", trial, before[0], gone)
				}
				if rest[after[0]].ID != ms[before[1]].ID {
					t.Fatalf("trial %d: a key of the removed member went to another than its next-ranked", trial)
				}
			}
		}
		share := float64(ms[gone].Weight) / float64(total)
		if got := float64(moved) / keys; got > share+0.04 {
			t.Fatalf("trial %d: %.3f of keys moved, the removed member's share is %.3f", trial, got, share)
		}
	}
}

func TestChainSharesPrefix(t *testing.T) {
	a := bytes.Repeat([]byte("system prompt "), 100)
	b := append(append([]byte{}, a...), bytes.Repeat([]byte("x"), 600)...)
	c := append(append([]byte{}, a[:700]...), bytes.Repeat([]byte("y"), 2000)...)
	ca, cb, cc := Chain(nil, a), Chain(nil, b), Chain(nil, c)
	if len(ca) != len(a)/BlockSize || len(cb) != len(b)/BlockSize {
		t.Fatalf("chain lengths %d %d, want %d %d", len(ca), len(cb), len(a)/BlockSize, len(b)/BlockSize)
	}
	for i := range ca {
		if ca[i] != cb[i] {
			t.Fatalf("block %d differs on a shared prefix", i)
		}
	}
	if cc[0] != ca[0] || cc[1] != ca[1] || cc[2] == ca[2] || cc[3] == ca[3] {
		t.Fatalf("a prompt sharing 700 bytes must share two blocks then differ")
	}
	// Equal blocks after different histories differ.
	d := append(bytes.Repeat([]byte("z"), BlockSize), a[BlockSize:2*BlockSize]...)
	if Chain(nil, d)[1] == ca[1] {
		t.Fatalf("an equal block after another history has the same hash")
	}
	buf := make([]uint64, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = Chain(buf, b) }); n != 0 {
		t.Fatalf("Chain into a buffer allocates %v", n)
	}
}

// conversation builds turn t of conversation c: a shared system prompt,
// then the conversation's own history, growing by a tool result a turn.
func conversation(system []byte, c, turn int) []byte {
	p := append([]byte{}, system...)
	for t := 0; t <= turn; t++ {
		p = fmt.Appendf(p, "conversation %d turn %d: %s\n", c, t, strings.Repeat(fmt.Sprintf("tool output %d.%d ", c, t), 40))
	}
	return p
}

func TestIndexFindsEachConversationsMember(t *testing.T) {
	system := bytes.Repeat([]byte("You are a coding agent. "), 200) // ~4.8 KB shared
	x := NewIndex(3, 0, time.Hour)
	now := time.Unix(1000, 0)
	home := map[int]int{}
	for turn := range 6 {
		for c := range 8 { // interleaved
			ch := Chain(nil, conversation(system, c, turn))
			m, matched := x.Longest(ch, now)
			if turn == 0 {
				home[c] = c % 3
			} else {
				if m != home[c] {
					t.Fatalf("conversation %d turn %d: Longest gives member %d, want %d", c, turn, m, home[c])
				}
				if f := float64(matched) / float64(len(ch)); f < 0.5 {
					t.Fatalf("conversation %d turn %d: matched %.2f of the prompt", c, turn, f)
				}
			}
			x.Record(home[c], ch, now)
			now = now.Add(time.Second)
		}
	}
}

func TestCacheAwareOrder(t *testing.T) {
	system := bytes.Repeat([]byte("sys "), 1000)
	ms := members(3)
	x := NewIndex(3, 0, time.Hour)
	p := &Pool{Policy: CacheAware, Threshold: 0.5, Index: x}
	now := time.Unix(1000, 0)
	prev := Chain(nil, conversation(system, 1, 0))
	x.Record(2, prev, now)
	next := Chain(nil, conversation(system, 1, 1))
	o, r, d := rank(p, ms, Request{Chain: next, Now: now})
	if o[0] != 2 || r[0].Kind != KindWarm || !d.First || d.Member != 2 || d.Matched != len(prev) {
		t.Fatalf("warm: order %v reasons %v decision %+v, want member 2 warm first", o, r, d)
	}
	if r[1].Kind != KindLeastBusy || !strings.HasPrefix(r[0].String(), "warm 0.") {
		t.Fatalf("reasons %v, want warm <fraction> then least_busy", r)
	}
	// A pin wins over the prefix.
	key := HashString("session")
	x.Pin(key, 0, now)
	if o, r, d := rank(p, ms, Request{Key: key, HasKey: true, Chain: next, Now: now}); o[0] != 0 || r[0].Kind != KindPinned || d.Member != 0 {
		t.Fatalf("pinned: order %v reasons %v", o, r)
	}
	// The pin ages out after the TTL; the prefix still answers... until it ages too.
	later := now.Add(2 * time.Hour)
	if o, r, d := rank(p, ms, Request{Key: key, HasKey: true, Chain: next, Now: later}); d.Member != -1 || r[0].Kind != KindLeastBusy {
		t.Fatalf("after the TTL: order %v reasons %v decision %+v, want least_busy", o, r, d)
	}
	// A busy warm member: the first-ranked is cold, the decision says
	// whom to wait for.
	ms[2].InFlight = ms[2].Limit
	o, r, d = rank(p, ms, Request{Chain: next, Now: now})
	if o[0] == 2 || r[0].Kind != KindCold || d.Member != 2 || d.First || o[2] != 2 {
		t.Fatalf("busy warm: order %v reasons %v decision %+v, want cold first, warm member 2 last", o, r, d)
	}
	// Below the threshold: least busy.
	p.Threshold = 0.99
	ms[2].InFlight = 0
	if _, r, d := rank(p, ms, Request{Chain: next, Now: now}); d.Member != -1 || r[0].Kind != KindLeastBusy {
		t.Fatalf("below the threshold: reasons %v decision %+v", r, d)
	}
}

func TestIndexLRUBound(t *testing.T) {
	x := NewIndex(1, 100, 0)
	now := time.Unix(1, 0)
	old := make([]uint64, 60)
	for i := range old {
		old[i] = uint64(1000 + i)
	}
	x.Record(0, old, now)
	newer := make([]uint64, 60)
	for i := range newer {
		newer[i] = uint64(5000 + i)
	}
	x.Record(0, newer, now)
	if n := len(x.members[0].where); n != 100 || len(x.members[0].slots) != 100 {
		t.Fatalf("%d blocks held (%d slots), want the capacity 100", n, len(x.members[0].slots))
	}
	if _, m := x.Longest(newer, now); m != 60 {
		t.Fatalf("the newest chain matched %d, want 60", m)
	}
	// The old chain lost its suffix (touched first, so oldest), kept its prefix.
	if _, m := x.Longest(old, now); m != 40 {
		t.Fatalf("the old chain matched %d, want its first 40 blocks", m)
	}
}

func TestIndexTTLAgeing(t *testing.T) {
	x := NewIndex(2, 0, time.Minute)
	now := time.Unix(1, 0)
	ch := []uint64{1, 2, 3}
	x.Record(1, ch, now)
	if m, n := x.Longest(ch, now.Add(59*time.Second)); m != 1 || n != 3 {
		t.Fatalf("within the TTL: %d %d", m, n)
	}
	if m, n := x.Longest(ch, now.Add(time.Minute)); m != -1 || n != 0 {
		t.Fatalf("after the TTL: member %d matched %d, want none", m, n)
	}
	x.Record(1, []uint64{9}, now.Add(2*time.Minute)) // drops the aged blocks
	if n := len(x.members[1].where); n != 1 {
		t.Fatalf("%d blocks kept after ageing, want 1", n)
	}
	x.Pin(7, 1, now)
	if m, ok := x.Pinned(7, now.Add(30*time.Second)); !ok || m != 1 {
		t.Fatalf("pin within the TTL: %d %v", m, ok)
	}
	if _, ok := x.Pinned(7, now.Add(time.Minute)); ok {
		t.Fatalf("pin after the TTL still there")
	}
}

func TestIndexPinsBounded(t *testing.T) {
	x := NewIndex(2, 0, time.Hour)
	x.maxPins = 10
	now := time.Unix(1, 0)
	for k := range 100 {
		x.Pin(uint64(k), k%2, now)
	}
	if len(x.pins) > 10 {
		t.Fatalf("%d pins kept, want at most 10", len(x.pins))
	}
	if m, ok := x.Pinned(99, now); !ok || m != 1 {
		t.Fatalf("the newest pin is lost")
	}
}

func TestCorrectDropsUnheldSuffix(t *testing.T) {
	x := NewIndex(2, 0, time.Hour)
	now := time.Unix(1, 0)
	ch := make([]uint64, 10)
	for i := range ch {
		ch[i] = uint64(100 + i)
	}
	x.Record(0, ch, now)
	// Predicted 10 blocks, reported 400 of 1000 prompt tokens: reuse ends
	// in block 4, so blocks 4…9 go.
	if n := x.Correct(0, ch, 10, 400, 1000); n != 6 {
		t.Fatalf("dropped %d blocks, want 6", n)
	}
	if _, m := x.Longest(ch, now); m != 4 {
		t.Fatalf("after the correction the member holds %d blocks, want 4", m)
	}
	// A report at least the prediction changes nothing; 0 drops the rest.
	if n := x.Correct(0, ch, 4, 500, 1000); n != 0 {
		t.Fatalf("a report covering the prediction dropped %d", n)
	}
	if n := x.Correct(0, ch, 4, 0, 1000); n != 4 {
		t.Fatalf("cached 0 dropped %d, want 4", n)
	}
	if m, n := x.Longest(ch, now); m != -1 || n != 0 {
		t.Fatalf("after cached 0: member %d matched %d", m, n)
	}
	// The freed slots are reused, not grown.
	x.Record(0, ch, now)
	if len(x.members[0].slots) != 10 {
		t.Fatalf("%d slots after re-recording, want 10", len(x.members[0].slots))
	}
}

func TestBadInputIsIgnored(t *testing.T) {
	x := NewIndex(2, 0, time.Hour)
	now := time.Unix(1, 0)
	x.Record(5, []uint64{1}, now)
	x.Record(-1, []uint64{1}, now)
	x.Pin(1, 9, now)
	if x.Correct(3, []uint64{1}, 1, 0, 10) != 0 || x.Correct(0, []uint64{1}, 1, 0, 0) != 0 {
		t.Fatal("bad Correct input dropped blocks")
	}
	if _, err := ParsePolicy("fastest"); err == nil {
		t.Fatal("unknown policy accepted")
	}
	for _, s := range []string{"first", "least_busy", "sticky", "cache_aware"} {
		if p, err := ParsePolicy(s); err != nil || p.String() != s {
			t.Fatalf("ParsePolicy(%q) = %v, %v", s, p, err)
		}
	}
	// An empty pool ranks nothing and does not panic.
	for _, pol := range []Policy{First, LeastBusy, Sticky, CacheAware} {
		p := &Pool{Policy: pol, Index: x}
		p.Rank(nil, Request{}, nil, nil)
	}
}

func TestAllocationFreeDecisions(t *testing.T) {
	ms := members(8)
	order, reasons := make([]int, 8), make([]Reason, 8)
	x := NewIndex(8, 0, time.Hour)
	ch := Chain(nil, bytes.Repeat([]byte("a"), 4096))
	x.Record(3, ch, time.Unix(1, 0))
	for _, pol := range []Policy{First, LeastBusy, Sticky, CacheAware} {
		p := &Pool{Policy: pol, Index: x, Threshold: 0.5}
		req := Request{Key: 42, HasKey: true, Chain: ch, Now: time.Unix(2, 0)}
		if n := testing.AllocsPerRun(200, func() { p.Rank(ms, req, order, reasons) }); n != 0 {
			t.Errorf("%v allocates %v per decision", pol, n)
		}
	}
}

// TestImportsOnlyStandardLibrary: placement is pure policy — no Caddy, no
// core, no ledger, no wire format.
func TestImportsOnlyStandardLibrary(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: placement imports only the standard library", f, path)
			}
		}
	}
}

// TestConcurrentUse: one pool ranked, recorded, corrected and pinned from
// several goroutines (run with -race); every ranking stays a permutation.
func TestConcurrentUse(t *testing.T) {
	x := NewIndex(3, 64, time.Minute)
	p := &Pool{Policy: CacheAware, Threshold: 0.5, Index: x}
	done := make(chan error)
	for g := range 4 {
		go func() {
			ms := members(3)
			order, reasons := make([]int, 3), make([]Reason, 3)
			now := time.Unix(1, 0)
			for i := range 200 {
				ch := Chain(nil, conversation([]byte("sys"), g, i%5))
				d := p.Rank(ms, Request{Key: uint64(g), HasKey: true, Chain: ch, Now: now}, order, reasons)
				if order[0]+order[1]+order[2] != 3 || order[0] == order[1] {
					done <- fmt.Errorf("order %v", order)
					return
				}
				x.Record(order[0], ch, now)
				x.Pin(uint64(g), order[0], now)
				x.Correct(order[0], ch, d.Matched, i%3*100, 1000)
				now = now.Add(time.Second)
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// New sessions whose prompts share only a long system prompt spread over
// the members (none holds two sessions more than another), while each
// session's later turns stay on its member.
func TestCacheAwareSpreadsNewSessions(t *testing.T) {
	x := NewIndex(3, 0, time.Hour)
	p := &Pool{Policy: CacheAware, Threshold: 0.5, Index: x}
	ms := members(3)
	now := time.Unix(1000, 0)
	system := strings.Repeat("You are a coding agent. ", 200) // ~4.8 KB, most of a first turn
	home := map[int]int{}
	per := make([]int, 3)
	for turn := range 4 {
		for s := range 8 {
			prompt := system + strings.Repeat("session "+strconv.Itoa(s)+" ", 40+turn*60)
			chain := Chain(nil, []byte(prompt))
			key := HashString("s" + strconv.Itoa(s))
			order, _, _ := rank(p, ms, Request{Key: key, HasKey: true, Chain: chain, Now: now})
			m := order[0]
			if turn == 0 {
				home[s] = m
				per[m]++
			} else if m != home[s] {
				t.Errorf("turn %d of session %d went to member %d, its home is %d", turn, s, m, home[s])
			}
			x.Record(m, chain, now)
			x.Pin(key, m, now)
		}
	}
	if slices.Max(per)-slices.Min(per) > 1 {
		t.Errorf("first turns per member %v: want an even spread", per)
	}
}

// TestChooseWeights: [90, 10] over 100,000 keys gives the second id 10 %
// (± 1 %), weight 0 is never chosen, all zero is -1, raising a weight only
// moves keys onto its id, and HashBytes equals HashString.
func TestChooseWeights(t *testing.T) {
	ids := []uint64{HashString("gpt-4o-mini"), HashString("gpt-5-mini"), HashString("never")}
	w := []uint32{90, 10, 0}
	var n [3]int
	const keys = 100000
	for i := range keys {
		c := Choose(HashString("u-"+strconv.Itoa(i)), ids, w)
		if c < 0 {
			t.Fatalf("key %d: no choice", i)
		}
		n[c]++
		if raised := Choose(HashString("u-"+strconv.Itoa(i)), ids, []uint32{90, 20, 0}); c == 1 && raised != 1 {
			t.Fatalf("key %d left the canary when its weight went up", i)
		}
	}
	if share := float64(n[1]) / keys; share < 0.09 || share > 0.11 {
		t.Errorf("second id got %.3f of the keys, want 0.10 ± 0.01 (%v)", share, n)
	}
	if n[2] != 0 {
		t.Errorf("weight 0 chosen %d times", n[2])
	}
	if c := Choose(1, ids, []uint32{0, 0, 0}); c != -1 {
		t.Errorf("all weights 0: got %d, want -1", c)
	}
	if HashBytes([]byte("u-42")) != HashString("u-42") {
		t.Error("HashBytes differs from HashString")
	}
}
