package integration

import (
	"net/http"
	"strings"
	"testing"
)

func TestSmokeChatAndModels(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 1))

	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer client-key")
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"hello"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	calls := up.Calls()
	if len(calls) != 1 {
		t.Fatalf("upstream calls = %d", len(calls))
	}
	if got := string(calls[0].Body); got != `{"model":"real-model","messages":[{"role":"user","content":"hi"}]}` {
		t.Errorf("upstream body = %s", got)
	}
	if got := calls[0].Header.Get("Authorization"); got != "Bearer sk-test-secret-1" {
		t.Errorf("upstream Authorization = %q", got)
	}
	if calls[0].Path != "/v1/chat/completions" {
		t.Errorf("path = %s", calls[0].Path)
	}
	mresp, err := testClient.Get(p.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if mb := readAll(t, mresp); !strings.Contains(mb, `"id":"m"`) {
		t.Errorf("models = %s", mb)
	}
}
