package placement

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkDecision: one Rank for each allocation-free policy over 3 and
// 8 members with mixed loads (the budget: 2 µs, 0 allocations).
func BenchmarkDecision(b *testing.B) {
	for _, pol := range []Policy{First, LeastBusy, Sticky} {
		for _, n := range []int{3, 8} {
			b.Run(fmt.Sprintf("%v/%d", pol, n), func(b *testing.B) {
				ms := members(n)
				for i := range ms {
					ms[i].InFlight = int64(i % 3)
					ms[i].Weight = uint32(1 + i)
				}
				p := &Pool{Policy: pol}
				order, reasons := make([]int, n), make([]Reason, n)
				req := Request{HasKey: true}
				b.ReportAllocs()
				for b.Loop() {
					req.Key++
					p.Rank(ms, req, order, reasons)
				}
			})
		}
	}
}

// prompt100K is a 100 K-token prompt (~400 KB) of one conversation with a
// shared system prompt.
func prompt100K() []byte {
	p := bytes.Repeat([]byte("You are a coding agent. "), 400)
	for i := 0; len(p) < 400_000; i++ {
		p = fmt.Appendf(p, "turn %d: tool result line %d of the file being edited\n", i/20, i)
	}
	return p
}

// BenchmarkCacheAware100K: the whole cache_aware decision for a 100
// K-token prompt over 3 members, one of which holds the previous turn:
// the chain of the prompt, then Rank (the index lookup). Its parts are
// reported apart.
func BenchmarkCacheAware100K(b *testing.B) {
	prompt := prompt100K()
	prev := Chain(nil, prompt[:len(prompt)-4000])
	newIndex := func() *Index {
		x := NewIndex(3, 0, time.Hour)
		for m := range 3 {
			x.Record(m, Chain(nil, append(bytes.Repeat([]byte{byte('a' + m)}, 3000), prompt[:200_000]...)), time.Unix(1, 0))
		}
		x.Record(1, prev, time.Unix(1, 0))
		return x
	}
	ms := members(3)
	order, reasons := make([]int, 3), make([]Reason, 3)
	chain := make([]uint64, 0, len(prompt)/BlockSize)
	now := time.Unix(2, 0)
	b.Run("chain+rank", func(b *testing.B) {
		p := &Pool{Policy: CacheAware, Threshold: 0.5, Index: newIndex()}
		b.SetBytes(int64(len(prompt)))
		b.ReportAllocs()
		for b.Loop() {
			chain = Chain(chain, prompt)
			if d := p.Rank(ms, Request{Chain: chain, Now: now}, order, reasons); d.Member != 1 {
				b.Fatalf("decision %+v, want member 1 warm", d)
			}
		}
	})
	b.Run("chain", func(b *testing.B) {
		b.SetBytes(int64(len(prompt)))
		b.ReportAllocs()
		for b.Loop() {
			chain = Chain(chain, prompt)
		}
	})
	b.Run("rank", func(b *testing.B) {
		p := &Pool{Policy: CacheAware, Threshold: 0.5, Index: newIndex()}
		chain = Chain(chain, prompt)
		b.ReportAllocs()
		for b.Loop() {
			p.Rank(ms, Request{Chain: chain, Now: now}, order, reasons)
		}
	})
	b.Run("record", func(b *testing.B) {
		x := newIndex()
		chain = Chain(chain, prompt)
		b.ReportAllocs()
		for b.Loop() {
			x.Record(1, chain, now)
		}
	})
}

// BenchmarkIndexBytesPerMember: the heap one member's blocks take when
// full at DefaultCapacity, reported as bytes/member (and per block).
func BenchmarkIndexBytesPerMember(b *testing.B) {
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		x := NewIndex(1, 0, time.Hour)
		chain := make([]uint64, DefaultCapacity)
		for i := range chain {
			chain[i] = mix(uint64(i) + 1)
		}
		x.Record(0, chain, time.Unix(1, 0))
		runtime.GC()
		runtime.ReadMemStats(&after)
		per := float64(after.HeapAlloc - before.HeapAlloc - uint64(8*len(chain)))
		runtime.KeepAlive(x)
		runtime.KeepAlive(chain)
		b.ReportMetric(per, "bytes/member")
		b.ReportMetric(per/DefaultCapacity, "bytes/block")
	}
}
