package llmroute

import (
	"sync"
	"testing"
	"time"
	"unsafe"
)

func TestHistoryFieldLayout(t *testing.T) {
	if len(allResults) != 9 || len(ttftBuckets)+1 != 12 {
		t.Fatalf("a traffic bucket has room for 9 results and 12 TTFT buckets; there are %d and %d", len(allResults), len(ttftBuckets)+1)
	}
	for i, r := range allResults {
		if resultIndex(r) != i {
			t.Errorf("resultIndex(%q) = %d, want %d", r, resultIndex(r), i)
		}
	}
}

// A million requests over six simulated hours: the ring keeps its size, and
// holds exactly the requests of its last 90 buckets.
func TestHistoryBoundedWhateverTheTraffic(t *testing.T) {
	hs := newHistory(hFields)
	size := func() uintptr {
		return unsafe.Sizeof(*hs) + uintptr(cap(hs.v))*unsafe.Sizeof(hs.v[0])
	}
	before := size()
	base := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC).UnixNano()
	const n = 1_000_000
	span := int64(6 * time.Hour)
	step := span / n
	perBucket := map[int64]int64{}
	for i := range int64(n) {
		now := base + i*step
		hs.add(now, hResults, 1)
		perBucket[now/int64(histWidth)]++
	}
	if after := size(); after != before || cap(hs.v) != histBuckets*hFields {
		t.Fatalf("the ring grew from %d to %d bytes (%d counters)", before, after, cap(hs.v))
	}
	end := base + (n-1)*step
	rows := hs.read(end, histRows(hFields))
	e := end / int64(histWidth)
	for k, row := range rows {
		want := perBucket[e-int64(histBuckets-1-k)]
		if row[hResults] != want {
			t.Fatalf("bucket %d holds %d requests, want %d", k, row[hResults], want)
		}
	}
	// Reading 15 minutes later finds nothing: every bucket is stale.
	for k, row := range hs.read(end+int64(15*time.Minute)+int64(histWidth), histRows(hFields)) {
		if row[hResults] != 0 {
			t.Fatalf("bucket %d still holds %d requests a window later", k, row[hResults])
		}
	}
	// Recording allocates nothing.
	if a := testing.AllocsPerRun(1000, func() { hs.add(time.Now().UnixNano(), hResults, 1) }); a != 0 {
		t.Errorf("recording allocates %v times", a)
	}
}

// Writers racing across a bucket boundary lose nothing: every add lands in
// the bucket of its time.
func TestHistoryConcurrentRollover(t *testing.T) {
	hs := newHistory(kFields)
	base := int64(1000) * int64(histWidth)
	const writers, each = 8, 20000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				// Alternate between two neighbouring buckets, the second
				// reached for the first time by whichever writer comes first.
				now := base + int64(i%2)*int64(histWidth) + int64(w)
				hs.add(now, 0, 1)
			}
		})
	}
	wg.Wait()
	rows := hs.read(base+int64(histWidth), histRows(kFields))
	if a, b := rows[histBuckets-2][0], rows[histBuckets-1][0]; a != writers*each/2 || b != writers*each/2 {
		t.Fatalf("buckets hold %d and %d, want %d each", a, b, writers*each/2)
	}
}

func TestHistoryQuantile(t *testing.T) {
	hist := make([]int64, 12)
	hist[2] = 10 // ten answers in (0.1, 0.25]
	if q := quantile(hist, .5); q == nil || *q != 0.175 {
		t.Errorf("p50 = %v, want 0.175 (halfway through the bucket)", q)
	}
	hist[11] = 10 // ten beyond 60 s
	if q := quantile(hist, .95); q == nil || *q != 60 {
		t.Errorf("p95 = %v, want 60 (the overflow's lower bound)", q)
	}
	if q := quantile(make([]int64, 12), .5); q != nil {
		t.Errorf("empty histogram's p50 = %v, want nil", *q)
	}
}

// BenchmarkHistoryRecordAttempt is what finish adds per attempt: the
// result and the slots in use, into the upstream's and the model's rings
// (finish reads the clock anyway, so the clock is not in the figure).
func BenchmarkHistoryRecordAttempt(b *testing.B) {
	t := &target{up: &upstream{hist: newHistory(hFields)}, mhist: newHistory(hFields)}
	now := time.Now().UnixNano()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t.recordAttempt(now, resultOK, 1)
		}
	})
}
