package llmroute

import (
	"net/http"
	"testing"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

func TestKeyFaultOf(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   keyFault
	}{
		{401, `{"error":{"code":"invalid_api_key"}}`, keyAuth},
		{403, `{"error":{"message":"forbidden"}}`, keyAuth},
		{403, `{"type":"error","error":{"type":"billing_error","message":"billing issue"}}`, keyQuota},
		{402, ``, keyQuota},
		{402, `{"type":"error","error":{"type":"billing_error","message":"There's an issue with your billing"}}`, keyQuota},
		{429, `{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}`, keyQuota},
		{429, `{"error":{"message":"Billing hard limit has been reached","type":"billing_hard_limit_reached"}}`, keyQuota},
		{429, `{"error":{"message":"Your account is not active, please check your billing details on our website.","type":"billing_not_active"}}`, keyQuota},
		{429, `{"error":{"code":"rate_limit_exceeded"}}`, keyRate},
		{400, `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}`, keyQuota},
		{400, `{"error":{"message":"max_tokens is too large"}}`, keyFine},
		{500, `{"error":{"type":"insufficient_quota"}}`, keyFine},
		{503, ``, keyFine},
	} {
		if got := keyFaultOf(tc.status, []byte(tc.body)); got != tc.want {
			t.Errorf("keyFaultOf(%d, %s) = %v, want %v", tc.status, tc.body, got, tc.want)
		}
	}
}

// pick skips cooling keys in every rotation, and allocates nothing.
func TestKeyPoolPickSkipsCoolingKeys(t *testing.T) {
	now := time.Now()
	for _, rot := range []string{rotationRandom, rotationRoundRobin, rotationLeastUsed} {
		kp := &keyPool{rotation: rot}
		for i := range 3 {
			kp.keys = append(kp.keys, poolKey{index: i, state: ledger.NewKeyState("k")})
		}
		led := ledger.NewMemory(func() {})
		led.CoolKey(kp.keys[1].state, now, time.Minute)
		for range 30 {
			if k := kp.pick(now); k == nil || k.index == 1 {
				t.Fatalf("%s: picked %v, a cooling key or none", rot, k)
			}
		}
		if allocs := testing.AllocsPerRun(100, func() { kp.pick(now) }); allocs != 0 {
			t.Errorf("%s: pick allocates %v times", rot, allocs)
		}
		led.CoolKey(kp.keys[0].state, now, time.Minute)
		led.CoolKey(kp.keys[2].state, now, 10*time.Second)
		if k := kp.pick(now); k != nil {
			t.Errorf("%s: every key cools, picked %d", rot, k.index)
		}
		if k, left := kp.soonest(now); k.index != 2 || left != 10*time.Second {
			t.Errorf("%s: soonest = %d %v, want key 2 in 10s", rot, k.index, left)
		}
	}
}

// A request to a provider with one key sets the pre-built header value
// and allocates nothing for it.
func TestTakeKeySingleKeyAllocatesNothing(t *testing.T) {
	u := &upstream{authValue: []string{"Bearer sk-one"}}
	r, _ := http.NewRequest(http.MethodPost, "http://x/v1/chat/completions", nil)
	c := call{u: u, r: r}
	if allocs := testing.AllocsPerRun(100, func() { c.takeKey() }); allocs != 0 {
		t.Errorf("takeKey allocates %v times", allocs)
	}
	if !c.takeKey() || c.auth[0] != "Bearer sk-one" {
		t.Errorf("auth = %v", c.auth)
	}
}
