package llmroute

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newKeysBenchHandler is newBenchHandler with n client keys (each with a
// models list, a rate and budgets, so every check runs) and priced
// upstream; the secret of key i is "sk-client-i".
func newKeysBenchHandler(tb testing.TB, upstream string, n int) *Handler {
	tb.Helper()
	var keys []string
	for i := 0; i < n; i++ {
		keys = append(keys, fmt.Sprintf(`{"id":"k%d","secret":"sk-client-%d","models":["m","m*"],"rpm":100000000,"burst":1000000,`+
			`"tokens_per_day":1000000000000,"spend_per_day":1000000000,"spend_per_month":1000000000}`, i, i))
	}
	raw := `{
		"providers": [{"id": "bench-p", "url": "` + upstream + `/v1", "key": "sk-bench"}],
		"upstreams": [{"id": "bench-u", "provider": "bench-p", "model": "real-model", "max_concurrency": 64,
			"price_input": 2.5, "price_output": 10}],
		"models": [{"name": "m", "upstreams": ["bench-u"]}],
		"keys": [` + strings.Join(keys, ",") + `]
	}`
	h := new(Handler)
	if err := json.Unmarshal([]byte(raw), h); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Cleanup() })
	// Both start-up goroutines log: wait for them before the logger is
	// replaced (as provisionBench does).
	<-h.proberDone
	<-h.pathChecks
	h.logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	return h
}

// BenchmarkServeHTTPKeys is BenchmarkServeHTTP with 1 000 keys configured:
// authentication, the rate check, the budget's check (Room), the
// attempt's reservation and its settlement on top of the request path.
func BenchmarkServeHTTPKeys(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchCompletion)
	}))
	defer up.Close()
	h := newKeysBenchHandler(b, up.URL, 1000)
	serve := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchRequest))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sk-client-567")
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil {
			b.Fatal(err)
		}
		return rec
	}
	if rec := serve(); rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), benchCompletion) {
		b.Fatalf("status %d body %s", rec.Code, rec.Body)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if rec := serve(); rec.Code != http.StatusOK {
			b.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
	}
}

// BenchmarkKeyChecks is the keys' own share of the hot path, without the
// upstream: authenticate (SHA-256 and lookup among 1 000 keys), the model
// check, GCRA, the budget's check (Room), then the attempt's reservation
// and its settlement.
func BenchmarkKeyChecks(b *testing.B) {
	h := newKeysBenchHandler(b, "http://127.0.0.1:1", 1000)
	rt := h.table.routes["m"]
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	rec := httptest.NewRecorder()
	res := attemptResult{out: outDone, result: resultOK}
	res.usage.Seen, res.usage.Input, res.usage.Output = true, 20, 9
	b.ReportAllocs()
	for b.Loop() {
		req.Header["Authorization"] = []string{"Bearer sk-client-567"}
		k := h.authenticate(rec, req, frontChat)
		kr := h.admitKey(rec, req, frontChat, k, rt, benchRequest)
		if _, ok, _ := rt.targets[0].up.ClaimLocal(); !ok {
			b.Fatal("no slot")
		}
		idx, e := h.reserveAttempt(kr, rt, 0)
		if e != nil || idx != 0 {
			b.Fatal(e)
		}
		rt.targets[0].up.ReleaseLocal()
		h.settleAttempt(kr, &rt.targets[0], res)
	}
}

// TestKeyChecksUnit: the benchmark's path settles to the reported usage
// and leaves nothing reserved.
func TestKeyChecksUnit(t *testing.T) {
	h := newKeysBenchHandler(t, "http://127.0.0.1:1", 3)
	rt := h.table.routes["m"]
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	req.Header.Set("X-Api-Key", "sk-client-2")
	rec := httptest.NewRecorder()
	k := h.authenticate(rec, req, frontChat)
	if k == nil || k.id != "k2" || req.Header.Get("X-Api-Key") != "" {
		t.Fatalf("key %+v, header left %q", k, req.Header.Get("X-Api-Key"))
	}
	kr := h.admitKey(rec, req, frontChat, k, rt, benchRequest)
	if kr == nil || kr.output != 256 || kr.input != int64(len(benchRequest)+3)/4 {
		t.Fatalf("keyReq %+v", kr)
	}
	rt.targets[0].up.ClaimLocal()
	if _, e := h.reserveAttempt(kr, rt, 0); e != nil {
		t.Fatal(e)
	}
	if u := h.keyStore.Usage("k2", time.Now()); u.ReservedToken != kr.input+256 {
		t.Fatalf("reserved %+v", u)
	}
	rt.targets[0].up.ReleaseLocal()
	res := attemptResult{out: outDone, result: resultOK}
	res.usage.Seen, res.usage.Input, res.usage.CachedInput, res.usage.Output = true, 1000, 400, 100
	h.settleAttempt(kr, &rt.targets[0], res)
	u := h.keyStore.Usage("k2", time.Now())
	// 600 × $2.5/M + 400 cached at the input price + 100 × $10/M.
	if u.ReservedToken != 0 || u.TokensToday != 1100 || u.SpendToday != 600*2500+400*2500+100*10000 {
		t.Fatalf("after settlement %+v", u)
	}
}
