package llmroute

import (
	"math"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// The last 15 minutes of traffic, for the status page's charts and
// `caddy llm-route status --watch`: a fixed ring of histBuckets buckets of
// histWidth per upstream, model, client key and pool. Its size never
// depends on the traffic: a bucket is a fixed row of counters, reused when
// its turn comes round again. Recording is an atomic add into the current
// bucket (no lock, no allocation); only the first writer of a new bucket
// zeroes it, and the rare writer that arrives during those few stores
// waits for them.

const (
	histWidth   = 10 * time.Second
	histBuckets = 90 // 15 minutes
)

// Fields of an upstream's or a model's bucket.
const (
	hResults = 0                       // attempts by result, allResults' order (9; a test checks)
	hTTFT    = hResults + 9            // time to first token histogram, ttftBuckets + overflow (12)
	hOutput  = hTTFT + 12              // output tokens
	hSlots   = hOutput + 1             // the most slots in use seen
	hFields  = hSlots + 1              // fields of a traffic ring
	kFields  = 4                       // a key's: served ok, served failed, spend (nano-USD), tokens
	pFields  = int(kindWaited) + 1 + 2 // a pool's: placements by kind, prompt tokens, cached tokens
	pPrompt  = int(kindWaited) + 1     // a pool's prompt tokens field
	pCached  = pPrompt + 1             // and its cached tokens
)

// history is one ring: histBuckets rows of n counters. epoch[i] is the
// bucket number (unix time / histWidth) row i holds, or minus it while the
// row is being zeroed for it.
type history struct {
	n     int
	epoch [histBuckets]atomic.Int64
	v     []atomic.Int64 // histBuckets*n, allocated once
}

func (*history) Destruct() error { return nil }

func newHistory(n int) *history {
	return &history{n: n, v: make([]atomic.Int64, histBuckets*n)}
}

// histories keeps the rings across reloads: an upstream, model, key or
// pool that keeps its id keeps its history.
var histories = caddy.NewUsagePool()

// adoptHistory returns the ring of key ("upstream/ID", …) with n fields,
// and records the reference for releaseHistories.
func (h *Handler) adoptHistory(key string, n int) *history {
	v, _, _ := histories.LoadOrNew(key, func() (caddy.Destructor, error) { return newHistory(n), nil })
	hs := v.(*history)
	if hs.n != n { // cannot happen: the key's prefix fixes n
		hs = newHistory(n)
	}
	h.histKeys = append(h.histKeys, key)
	return hs
}

// releaseHistories gives back the handler's references.
func (h *Handler) releaseHistories() {
	for _, k := range h.histKeys {
		_, _ = histories.Delete(k)
	}
	h.histKeys = nil
}

// row returns the counters of the bucket of time now (unix nanoseconds),
// zeroing it first when it last held an older bucket; nil for a time the
// ring has moved past (a writer that stalled longer than the window).
func (hs *history) row(now int64) []atomic.Int64 {
	e := now / int64(histWidth)
	i := int(e % histBuckets)
	ep := &hs.epoch[i]
	for {
		old := ep.Load()
		switch {
		case old == e:
			return hs.v[i*hs.n : (i+1)*hs.n]
		case old > e || -old > e:
			return nil
		case old < 0: // another writer is zeroing the row
			runtime.Gosched()
		case ep.CompareAndSwap(old, -e):
			row := hs.v[i*hs.n : (i+1)*hs.n]
			for j := range row {
				row[j].Store(0)
			}
			ep.Store(e)
			return row
		}
	}
}

// add adds d to field f of now's bucket.
func (hs *history) add(now int64, f int, d int64) {
	if hs == nil || d == 0 {
		return
	}
	if row := hs.row(now); row != nil {
		row[f].Add(d)
	}
}

// atLeast raises field f of now's bucket to v.
func (hs *history) atLeast(now int64, f int, v int64) {
	if hs == nil {
		return
	}
	row := hs.row(now)
	if row == nil {
		return
	}
	for {
		cur := row[f].Load()
		if cur >= v || row[f].CompareAndSwap(cur, v) {
			return
		}
	}
}

// resultIndex is the place of a result in allResults, -1 if unknown.
func resultIndex(r string) int {
	switch r {
	case resultOK:
		return 0
	case result4xx:
		return 1
	case result429:
		return 2
	case result402:
		return 3
	case result5xx:
		return 4
	case resultNetErr:
		return 5
	case resultTimeout:
		return 6
	case resultCancelled:
		return 7
	case resultAuthErr:
		return 8
	}
	return -1
}

// recordAttempt notes an attempt that ended on t at now: its result, and
// for the upstream the slots in use before it released its own (inUse).
func (t *target) recordAttempt(now int64, result string, inUse int64) {
	i := resultIndex(result)
	if i >= 0 {
		t.mhist.add(now, hResults+i, 1)
	}
	row := t.up.hist.rowOf(now)
	if row == nil {
		return
	}
	if i >= 0 {
		row[hResults+i].Add(1)
	}
	for {
		cur := row[hSlots].Load()
		if cur >= inUse || row[hSlots].CompareAndSwap(cur, inUse) {
			return
		}
	}
}

// rowOf is row for a ring that may be nil.
func (hs *history) rowOf(now int64) []atomic.Int64 {
	if hs == nil {
		return nil
	}
	return hs.row(now)
}

// recordAnswer notes an answered request's time to first token (ttft < 0:
// no byte reached the client) and output tokens.
func (t *target) recordAnswer(now int64, ttft time.Duration, output int64) {
	b := -1
	if ttft >= 0 {
		s := ttft.Seconds()
		b = len(ttftBuckets)
		for j, le := range ttftBuckets {
			if s <= le {
				b = j
				break
			}
		}
	}
	for _, hs := range [2]*history{t.up.hist, t.mhist} {
		if hs == nil {
			continue
		}
		row := hs.row(now)
		if row == nil {
			continue
		}
		if b >= 0 {
			row[hTTFT+b].Add(1)
		}
		if output > 0 {
			row[hOutput].Add(output)
		}
	}
}

// ---- reading ----

// historyAnswer is GET /llm_route/history: per bucket, oldest first, the
// last bucket being the current (partial) one.
type historyAnswer struct {
	Now           time.Time `json:"now"`
	BucketSeconds int       `json:"bucket_seconds"`
	// Start is the start of the first bucket.
	Start     time.Time        `json:"start"`
	Upstreams []trafficHistory `json:"upstreams"`
	Models    []trafficHistory `json:"models"`
	Keys      []keyHistory     `json:"keys"`
	Pools     []poolHistory    `json:"pools"`
}

// trafficHistory is an upstream's or a model's series.
type trafficHistory struct {
	ID       string `json:"id"`
	Provider string `json:"provider,omitempty"` // upstreams
	Limit    *int64 `json:"limit,omitempty"`    // upstreams; absent = unlimited
	// Requests counts the attempts that ended in each bucket, by result;
	// only the results seen in the window are present.
	Requests map[string][]int64 `json:"requests"`
	// TTFTP50 and TTFTP95 are the quantiles of time to first token in
	// seconds (null: no answer in the bucket), from a histogram with the
	// bounds of llm_proxy_time_to_first_token_seconds.
	TTFTP50 []*float64 `json:"ttft_p50"`
	TTFTP95 []*float64 `json:"ttft_p95"`
	// OutputTokens counts the output tokens the answers reported.
	OutputTokens []int64 `json:"output_tokens"`
	// Slots is the most slots in use seen in the bucket (sampled when an
	// attempt ends and when the history is read); upstreams only.
	Slots []int64 `json:"slots,omitempty"`
}

// keyHistory is a client key's series and its budgets now.
type keyHistory struct {
	keyStatus
	// Served and Failed count its requests that ended (ok / any other
	// result); SpendUSD what they cost.
	Served   []int64   `json:"served"`
	Failed   []int64   `json:"failed"`
	SpendUSD []float64 `json:"spend_usd"`
	Tokens   []int64   `json:"tokens"`
}

// poolHistory is a pool's placements by reason and its cached ratio.
type poolHistory struct {
	ID         string             `json:"id"`
	Placement  string             `json:"placement"`
	Placements map[string][]int64 `json:"placements"` // only the reasons seen
	// CachedRatio is the share of prompt tokens the members reported
	// reused (null: no answer reported it).
	CachedRatio []*float64 `json:"cached_ratio"`
}

// read returns the ring's rows, oldest first, ending with now's bucket;
// rows of buckets nothing was recorded in are zero. out is reused.
func (hs *history) read(now int64, out [][]int64) [][]int64 {
	e := now / int64(histWidth)
	for k := range histBuckets {
		want := e - int64(histBuckets-1-k)
		row := out[k][:hs.n]
		clear(row)
		i := int(want % histBuckets)
		if hs.epoch[i].Load() != want {
			continue
		}
		for j := range row {
			row[j] = hs.v[i*hs.n+j].Load()
		}
		if hs.epoch[i].Load() != want { // reused while read
			clear(row)
		}
	}
	return out
}

func histRows(n int) [][]int64 {
	out := make([][]int64, histBuckets)
	for k := range out {
		out[k] = make([]int64, n)
	}
	return out
}

func (hs *history) traffic(now int64) trafficHistory {
	rows := hs.read(now, histRows(hs.n))
	th := trafficHistory{Requests: map[string][]int64{}, TTFTP50: make([]*float64, histBuckets),
		TTFTP95: make([]*float64, histBuckets), OutputTokens: make([]int64, histBuckets), Slots: make([]int64, histBuckets)}
	for i, res := range allResults {
		var s []int64
		for k, row := range rows {
			if n := row[hResults+i]; n > 0 {
				if s == nil {
					s = make([]int64, histBuckets)
				}
				s[k] = n
			}
		}
		if s != nil {
			th.Requests[res] = s
		}
	}
	for k, row := range rows {
		hist := row[hTTFT : hTTFT+12]
		th.TTFTP50[k] = quantile(hist, .5)
		th.TTFTP95[k] = quantile(hist, .95)
		th.OutputTokens[k] = row[hOutput]
		th.Slots[k] = row[hSlots]
	}
	return th
}

// quantile estimates the q-quantile of a ttftBuckets histogram by linear
// interpolation within its bucket, as Prometheus's histogram_quantile does
// (the overflow bucket answers its lower bound); nil when it is empty.
func quantile(hist []int64, q float64) *float64 {
	var total int64
	for _, n := range hist {
		total += n
	}
	if total == 0 {
		return nil
	}
	rank := q * float64(total)
	var seen float64
	for j, n := range hist {
		if n == 0 || seen+float64(n) < rank {
			seen += float64(n)
			continue
		}
		lo := 0.0
		if j > 0 {
			lo = ttftBuckets[j-1]
		}
		if j == len(ttftBuckets) {
			return new(lo)
		}
		v := lo + (ttftBuckets[j]-lo)*(rank-seen)/float64(n)
		return new(math.Round(v*1000) / 1000)
	}
	return new(ttftBuckets[len(ttftBuckets)-1])
}

// historyOf reads the history of every running llm_route handler, each id
// once as the newest config has it, like the status.
func historyOf(now time.Time) historyAnswer {
	ns := now.UnixNano()
	e := ns / int64(histWidth)
	ans := historyAnswer{Now: now, BucketSeconds: int(histWidth / time.Second),
		Start:     time.Unix(0, (e-histBuckets+1)*int64(histWidth)).UTC(),
		Upstreams: []trafficHistory{}, Models: []trafficHistory{}, Keys: []keyHistory{}, Pools: []poolHistory{}}
	live := liveHandlers()
	seen := make(map[string]bool)
	keyStat := make(map[string]keyStatus)
	for _, ks := range keyStatuses(live, now) {
		keyStat[ks.ID] = ks
	}
	for _, en := range live {
		h := en.h
		for _, uc := range h.Upstreams {
			u := h.table.upstreams[uc.ID]
			if u == nil || u.hist == nil || seen["u/"+u.ID] {
				continue
			}
			seen["u/"+u.ID] = true
			// The slots in use now, so that a long stream shows while it runs.
			u.hist.atLeast(ns, hSlots, u.State.Inflight())
			th := u.hist.traffic(ns)
			th.ID, th.Provider = u.ID, u.Provider
			if l := u.State.Limit(); l != ledger.Unlimited {
				th.Limit = new(l)
			}
			ans.Upstreams = append(ans.Upstreams, th)
		}
		for _, name := range h.table.modelList {
			hs := h.modelHist[name]
			if hs == nil || seen["m/"+name] {
				continue
			}
			seen["m/"+name] = true
			th := hs.traffic(ns)
			th.ID, th.Slots = name, nil
			ans.Models = append(ans.Models, th)
		}
		for _, kc := range h.Keys { // config order
			hs := h.keyHist[kc.ID]
			if hs == nil || seen["k/"+kc.ID] {
				continue
			}
			seen["k/"+kc.ID] = true
			rows := hs.read(ns, histRows(kFields))
			kh := keyHistory{keyStatus: keyStat[kc.ID], Served: make([]int64, histBuckets), Failed: make([]int64, histBuckets),
				SpendUSD: make([]float64, histBuckets), Tokens: make([]int64, histBuckets)}
			kh.ID = kc.ID
			for j, row := range rows {
				kh.Served[j], kh.Failed[j], kh.SpendUSD[j], kh.Tokens[j] = row[0], row[1], float64(row[2])/1e9, row[3]
			}
			ans.Keys = append(ans.Keys, kh)
		}
		for _, pc := range h.Pools {
			p := h.table.pools[pc.ID]
			if p == nil || p.hist == nil || seen["p/"+p.id] {
				continue
			}
			seen["p/"+p.id] = true
			rows := p.hist.read(ns, histRows(pFields))
			ph := poolHistory{ID: p.id, Placement: p.policy.String(), Placements: map[string][]int64{},
				CachedRatio: make([]*float64, histBuckets)}
			for kind := 1; kind <= int(kindWaited); kind++ {
				var s []int64
				for j, row := range rows {
					if n := row[kind]; n > 0 {
						if s == nil {
							s = make([]int64, histBuckets)
						}
						s[j] = n
					}
				}
				if s != nil {
					ph.Placements[reasonNames[kind]] = s
				}
			}
			for j, row := range rows {
				if row[pPrompt] > 0 {
					ph.CachedRatio[j] = new(math.Round(float64(row[pCached])/float64(row[pPrompt])*1000) / 1000)
				}
			}
			ans.Pools = append(ans.Pools, ph)
		}
	}
	return ans
}
