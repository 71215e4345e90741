package llmroute

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// Between a handler's start and its cleanup, the key usage is written to
// the storage every keyUsageEvery while something was settled, so a crash
// loses at most that much; nothing is written while nothing changes.
func TestKeyUsageWrittenPeriodically(t *testing.T) {
	defer func(d time.Duration) { keyUsageEvery = d }(keyUsageEvery)
	keyUsageEvery = 20 * time.Millisecond
	fs := *caddy.DefaultStorage // Caddy's file system storage, in a directory of the test
	fs.Path = t.TempDir()
	st := &fs
	ledger.LocalKeys().Acquire("periodic")
	defer ledger.LocalKeys().Release("periodic")
	usageSaver.attach(st, zap.NewNop())
	defer usageSaver.detach(st)

	saved := func() usageEntry {
		doc, err := loadUsage(st)
		if err != nil {
			t.Fatal(err)
		}
		return doc.Keys["periodic"]
	}
	for _, want := range []int64{7, 14} {
		ledger.LocalKeys().Record("periodic", keys.Amount{Tokens: 7, Spend: 3}, time.Now())
		deadline := time.Now().Add(10 * time.Second)
		for saved().TokensToday != want {
			if time.Now().After(deadline) {
				t.Fatalf("the storage has %+v 10 s after the use, want %d tokens today", saved(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if e := saved(); e.SpendTodayNano != 6 || e.SpendMonthNano != 6 || e.Day != time.Now().UTC().Format(time.DateOnly) {
		t.Fatalf("saved entry %+v, want $6e-9 spent today and this month", e)
	}
	// Unchanged: not written again (the document's time stays).
	doc, _ := loadUsage(st)
	time.Sleep(10 * keyUsageEvery)
	if again, _ := loadUsage(st); !again.Saved.Equal(doc.Saved) || len(again.Keys) != len(doc.Keys) {
		t.Fatalf("written again without a change: %v then %v", doc.Saved, again.Saved)
	}
}
