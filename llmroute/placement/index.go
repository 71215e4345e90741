package placement

import (
	"sync"
	"time"
)

// Defaults of an index.
const (
	// DefaultCapacity is the blocks an index keeps per member: 16 Ki
	// blocks of 256 bytes are 4 MiB of prompt, about a million tokens —
	// more than the KV cache of one GPU holds, so the index forgets after
	// the engine does, not before.
	DefaultCapacity = 16 << 10
	// DefaultPins is the affinity pins an index keeps.
	DefaultPins = 64 << 10
)

// Index is a pool's approximate prefix index: per member, the chain
// hashes of the prompts sent to it, bounded (least recently used first
// out) and aged by a TTL; and the affinity pins, key hash → the member
// that served it last. Members are the pool's positions 0…n-1. Safe for
// concurrent use (one mutex).
type Index struct {
	mu      sync.Mutex
	ttl     int64 // nanoseconds; 0 never ages
	cap     int
	maxPins int
	members []memberBlocks
	pins    map[uint64]pin
	// sessions counts the pins per member (stale ones until swept), for
	// cache_aware's balance of new sessions; swept is the last sweep.
	sessions []int
	swept    int64
}

type pin struct {
	member int32
	at     int64
}

// memberBlocks is one member's blocks: an LRU list threaded through a
// slot array (24 bytes a block) and a map from hash to slot.
type memberBlocks struct {
	slots      []slot
	where      map[uint64]int32
	head, tail int32 // most and least recently used, -1 when empty
	free       int32 // a freed slot list through next, -1 when none
}

type slot struct {
	hash       uint64
	at         int64 // unix nanoseconds of the last record
	prev, next int32
}

// NewIndex returns an index for members members keeping up to capacity
// blocks per member (≤ 0: DefaultCapacity) and DefaultPins pins, each
// aged out ttl after it was last recorded (0: never).
func NewIndex(members, capacity int, ttl time.Duration) *Index {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	x := &Index{ttl: int64(ttl), cap: capacity, maxPins: DefaultPins, members: make([]memberBlocks, max(members, 0)), pins: map[uint64]pin{},
		sessions: make([]int, max(members, 0))}
	for i := range x.members {
		x.members[i] = memberBlocks{where: map[uint64]int32{}, head: -1, tail: -1, free: -1}
	}
	return x
}

func (x *Index) live(at, now int64) bool { return x.ttl == 0 || now-at < x.ttl }

// Record notes that chain was sent to member at now. It touches the chain
// from its last block to its first, so a prefix is never older than its
// suffix: eviction and ageing take suffixes first.
func (x *Index) Record(member int, chain []uint64, now time.Time) {
	if member < 0 || member >= len(x.members) {
		return
	}
	t := now.UnixNano()
	x.mu.Lock()
	defer x.mu.Unlock()
	mb := &x.members[member]
	for mb.tail >= 0 && !x.live(mb.slots[mb.tail].at, t) {
		mb.remove(mb.tail)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		mb.touch(chain[i], t, x.cap)
	}
}

// Matches fills dst[i] (len(dst) members) with the blocks of chain's
// prefix that member i holds at now.
func (x *Index) Matches(chain []uint64, now time.Time, dst []int) {
	t := now.UnixNano()
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range dst {
		dst[i] = 0
		if i < len(x.members) {
			dst[i] = x.prefix(&x.members[i], chain, t)
		}
	}
}

// Longest returns the member holding the longest prefix of chain at now
// and its length in blocks; the lower index wins a tie; -1, 0 when none
// holds a block.
func (x *Index) Longest(chain []uint64, now time.Time) (member, matched int) {
	t := now.UnixNano()
	member = -1
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range x.members {
		if m := x.prefix(&x.members[i], chain, t); m > matched {
			member, matched = i, m
		}
	}
	return member, matched
}

func (x *Index) matchedOne(member int, chain []uint64, now time.Time) int {
	if member < 0 || member >= len(x.members) {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.prefix(&x.members[member], chain, now.UnixNano())
}

// prefix is the length of the longest prefix of chain mb holds: a binary
// search, since a member that holds block i holds the blocks before it
// (Record's order keeps that true under eviction and ageing).
func (x *Index) prefix(mb *memberBlocks, chain []uint64, t int64) int {
	held := func(i int) bool {
		s, ok := mb.where[chain[i]]
		return ok && x.live(mb.slots[s].at, t)
	}
	if len(chain) == 0 || !held(0) {
		return 0
	}
	lo, hi := 1, len(chain) // blocks < lo held; the answer is in [lo, hi]
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if held(mid) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Correct applies what member reported it reused of a request whose chain
// is chain: predicted is the blocks the index said the member held
// (Decision.Matched), cachedTokens what the member reported reusing and
// promptTokens the prompt's tokens (the chain's tokens per block follow
// from it). When the reuse ends before the predicted prefix, the member
// loses chain from the block where the reuse ends (a partly reused block
// stays) to its end. It returns the blocks dropped.
func (x *Index) Correct(member int, chain []uint64, predicted, cachedTokens, promptTokens int) int {
	if member < 0 || member >= len(x.members) || promptTokens <= 0 || len(chain) == 0 {
		return 0
	}
	cachedTokens = min(max(cachedTokens, 0), promptTokens)
	predicted = min(predicted, len(chain))
	// ceil(cached × blocks ÷ prompt tokens), in integers.
	held := int((int64(cachedTokens)*int64(len(chain)) + int64(promptTokens) - 1) / int64(promptTokens))
	if held >= predicted {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	mb := &x.members[member]
	dropped := 0
	for _, h := range chain[held:] {
		if s, ok := mb.where[h]; ok {
			mb.remove(s)
			dropped++
		}
	}
	return dropped
}

// Pin notes that member served the affinity key key at now.
func (x *Index) Pin(key uint64, member int, now time.Time) {
	if member < 0 || member >= len(x.members) {
		return
	}
	t := now.UnixNano()
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.pins[key]; ok {
		x.sessions[old.member]--
	} else if len(x.pins) >= x.maxPins || x.ttl > 0 && t-x.swept > x.ttl/4 {
		x.prunePins(t)
	}
	x.pins[key] = pin{member: int32(member), at: t}
	x.sessions[member]++
}

// prunePins sweeps the aged pins out (so the session counts follow) and
// makes room for one more: if none has aged an arbitrary one (map order)
// goes — a pin lost early costs one cold turn, which a bounded memory is
// worth.
func (x *Index) prunePins(t int64) {
	x.swept = t
	for k, p := range x.pins {
		if !x.live(p.at, t) {
			x.dropPin(k, p)
		}
	}
	for k, p := range x.pins {
		if len(x.pins) < x.maxPins {
			return
		}
		x.dropPin(k, p)
	}
}

func (x *Index) dropPin(k uint64, p pin) {
	delete(x.pins, k)
	x.sessions[p.member]--
}

// Sessions fills dst[i] (len(dst) members) with the affinity keys pinned
// to member i (aged ones included until a sweep, at most a quarter of
// the TTL late).
func (x *Index) Sessions(dst []int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range dst {
		dst[i] = 0
		if i < len(x.sessions) {
			dst[i] = x.sessions[i]
		}
	}
}

// Unpin forgets key's pin if it names member: that member's report
// contradicted it (a pin to another member, set since, stays).
func (x *Index) Unpin(key uint64, member int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if p, ok := x.pins[key]; ok && int(p.member) == member {
		x.dropPin(key, p)
	}
}

// Pinned returns the member that served key last, if within the TTL.
func (x *Index) Pinned(key uint64, now time.Time) (member int, ok bool) {
	t := now.UnixNano()
	x.mu.Lock()
	defer x.mu.Unlock()
	p, ok := x.pins[key]
	if !ok || !x.live(p.at, t) {
		return -1, false
	}
	return int(p.member), true
}

// touch records h at t as the most recently used block, evicting the
// least recently used when the member is at capacity.
func (mb *memberBlocks) touch(h uint64, t int64, capacity int) {
	if s, ok := mb.where[h]; ok {
		mb.slots[s].at = t
		mb.unlink(s)
		mb.pushHead(s)
		return
	}
	var s int32
	switch {
	case mb.free >= 0:
		s = mb.free
		mb.free = mb.slots[s].next
	case len(mb.slots) < capacity:
		mb.slots = append(mb.slots, slot{})
		s = int32(len(mb.slots) - 1)
	default:
		s = mb.tail
		mb.unlink(s)
		delete(mb.where, mb.slots[s].hash)
	}
	mb.slots[s] = slot{hash: h, at: t}
	mb.where[h] = s
	mb.pushHead(s)
}

// remove frees slot s.
func (mb *memberBlocks) remove(s int32) {
	mb.unlink(s)
	delete(mb.where, mb.slots[s].hash)
	mb.slots[s] = slot{next: mb.free}
	mb.free = s
}

func (mb *memberBlocks) unlink(s int32) {
	p, n := mb.slots[s].prev, mb.slots[s].next
	if p >= 0 {
		mb.slots[p].next = n
	} else {
		mb.head = n
	}
	if n >= 0 {
		mb.slots[n].prev = p
	} else {
		mb.tail = p
	}
}

func (mb *memberBlocks) pushHead(s int32) {
	mb.slots[s].prev, mb.slots[s].next = -1, mb.head
	if mb.head >= 0 {
		mb.slots[mb.head].prev = s
	} else {
		mb.tail = s
	}
	mb.head = s
}
