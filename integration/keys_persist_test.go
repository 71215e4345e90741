package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// A key's usage under state memory survives a stop and a start of Caddy
// with the same storage: the status shows it, and the budget it used up
// still refuses. A reload neither loads it a second time nor loses what
// was used since the start. Usage of a past day does not come back as
// today's (the month's does).
func TestKeysUsagePersistsAcrossRestart(t *testing.T) {
	up := newUpstream(t, usageAnswer(400, 500))
	h := persistConfig(up)
	p := startProxy(t, h)
	for _, secret := range []string{"llmr-budget-5ecret", "llmr-free-5ecret"} {
		if code, body := keyedChat(t, p, secret); code != http.StatusOK {
			t.Fatalf("first request: %d %s", code, body)
		}
	}
	wantKeyUsage(t, p, "budget", "before the restart", 900, 0.019, 0.019)
	if code, body := keyedChat(t, p, "llmr-budget-5ecret"); code != http.StatusTooManyRequests || !strings.Contains(body, "insufficient_quota") {
		t.Fatalf("900 of 1,000 tokens used, 125 more asked: %d %s; want 429 insufficient_quota", code, body)
	}

	// Stop Caddy (as at a shutdown) and start it again on the same storage.
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	p.load(h)
	wantKeyUsage(t, p, "budget", "after the restart", 900, 0.019, 0.019)
	if code, body := keyedChat(t, p, "llmr-budget-5ecret"); code != http.StatusTooManyRequests || !strings.Contains(body, "insufficient_quota") {
		t.Fatalf("after the restart: %d %s; want the used-up budget to refuse (429 insufficient_quota)", code, body)
	}
	wantKeyUsage(t, p, "free", "after the restart", 900, 0.019, 0.019)

	// Use more, then reload: counted once, nothing lost.
	if code, body := keyedChat(t, p, "llmr-free-5ecret"); code != http.StatusOK {
		t.Fatalf("free after the restart: %d %s", code, body)
	}
	p.load(h)
	wantKeyUsage(t, p, "free", "after a reload", 1800, 0.038, 0.038)
	wantKeyUsage(t, p, "budget", "after a reload", 900, 0.019, 0.019)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	p.load(h)
	wantKeyUsage(t, p, "free", "after a reload and a restart", 1800, 0.038, 0.038)

	// The saved usage turned into yesterday's: today starts from nothing,
	// the month keeps it.
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(p.storage, "llm_route", "key_usage.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the usage file: %v", err)
	}
	if strings.Contains(string(b), "5ecret") {
		t.Fatalf("the usage file holds a secret: %s", b)
	}
	today := time.Now().UTC().Format(time.DateOnly)
	yesterday := time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	if !strings.Contains(string(b), `"day":"`+today+`"`) {
		t.Fatalf("the usage file has no day %s: %s", today, b)
	}
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(string(b), `"day":"`+today+`"`, `"day":"`+yesterday+`"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	p.load(h)
	wantKeyUsage(t, p, "budget", "after a restart on yesterday's usage", 0, 0, 0.019)
	if code, body := keyedChat(t, p, "llmr-budget-5ecret"); code != http.StatusOK {
		t.Fatalf("a new day: %d %s; want the daily budget fresh", code, body)
	}
}
