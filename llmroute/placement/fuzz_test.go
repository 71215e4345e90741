package placement

import (
	"testing"
	"time"
)

// FuzzChain: any prompt hashes without panic to one hash per full block,
// the same every time, and a prompt's chain is a prefix of the chain of
// the prompt extended.
func FuzzChain(f *testing.F) {
	f.Add([]byte("hello"), []byte("world"))
	f.Add(make([]byte, 3*BlockSize+7), []byte{0xff, 0})
	f.Fuzz(func(t *testing.T, prompt, more []byte) {
		a := Chain(nil, prompt)
		if len(a) != len(prompt)/BlockSize {
			t.Fatalf("%d hashes for %d bytes", len(a), len(prompt))
		}
		b := Chain(make([]uint64, 0, 1), prompt)
		ext := Chain(nil, append(append([]byte{}, prompt...), more...))
		for i := range a {
			if a[i] != b[i] || a[i] != ext[i] {
				t.Fatalf("block %d: hashing is not deterministic or an extension changes the prefix", i)
			}
		}
		// The same bytes cut into parts anywhere chain the same.
		cut := len(more) % (len(prompt) + 1)
		parts := ChainParts(nil, prompt[:cut], nil, prompt[cut:], more)
		if len(parts) != len(ext) {
			t.Fatalf("ChainParts: %d hashes, Chain of the concatenation: %d", len(parts), len(ext))
		}
		for i := range ext {
			if parts[i] != ext[i] {
				t.Fatalf("block %d: ChainParts differs from Chain of the concatenation", i)
			}
		}
	})
}

// FuzzIndex: arbitrary prompts recorded on members, looked up, corrected
// and pinned, never panic; Longest never exceeds the chain and answers the
// same twice; a chain just recorded on a member is found in full.
func FuzzIndex(f *testing.F) {
	f.Add([]byte("a long prompt"), []byte("another"), uint8(1), uint16(3), uint16(100), uint8(2))
	f.Add(make([]byte, 5000), make([]byte, 2600), uint8(0), uint16(0), uint16(0), uint8(7))
	f.Fuzz(func(t *testing.T, p1, p2 []byte, member uint8, cached, promptTokens uint16, capacity uint8) {
		x := NewIndex(3, int(capacity)+1, time.Minute)
		now := time.Unix(100, 0)
		c1, c2 := Chain(nil, p1), Chain(nil, p2)
		m := int(member % 4) // 3 is out of range on purpose
		x.Record(m, c1, now)
		x.Record((m+1)%3, c2, now)
		x.Record(m, c2, now)
		for _, c := range [][]uint64{c1, c2} {
			who, n := x.Longest(c, now)
			if n > len(c) || n < 0 || (n == 0) != (who == -1) {
				t.Fatalf("Longest = %d, %d for a chain of %d", who, n, len(c))
			}
			if who2, n2 := x.Longest(c, now); who2 != who || n2 != n {
				t.Fatalf("Longest not deterministic: %d,%d then %d,%d", who, n, who2, n2)
			}
		}
		if m < 3 && len(c2) <= int(capacity)+1 {
			if _, n := x.Longest(c2, now); n != len(c2) {
				t.Fatalf("a chain of %d just recorded within capacity %d matched %d", len(c2), capacity+1, n)
			}
		}
		_, n := x.Longest(c1, now)
		x.Correct(m, c1, n, int(cached), int(promptTokens))
		if _, n2 := x.Longest(c1, now); n2 > n {
			t.Fatalf("a correction grew the match from %d to %d", n, n2)
		}
		x.Pin(uint64(len(p1)), m, now)
		if got, ok := x.Pinned(uint64(len(p1)), now); ok != (m < 3) || ok && got != m {
			t.Fatalf("Pinned = %d, %v after pinning member %d", got, ok, m)
		}
		x.Unpin(uint64(len(p1)), (m+1)%3)
		if got, ok := x.Pinned(uint64(len(p1)), now); ok != (m < 3) || ok && got != m {
			t.Fatalf("Unpin of another member removed the pin: %d, %v", got, ok)
		}
		x.Unpin(uint64(len(p1)), m)
		if _, ok := x.Pinned(uint64(len(p1)), now); ok {
			t.Fatalf("Unpin left the pin on member %d", m)
		}
		ms := members(3)
		p := &Pool{Policy: CacheAware, Threshold: 0.5, Index: x}
		order, reasons := make([]int, 3), make([]Reason, 3)
		p.Rank(ms, Request{Key: uint64(len(p1)), HasKey: true, Chain: c1, Now: now}, order, reasons)
		if order[0]+order[1]+order[2] != 3 || order[0] == order[1] {
			t.Fatalf("order %v is not a permutation", order)
		}
	})
}
