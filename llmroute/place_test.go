package llmroute

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Ranking a request's pool steps and ordering a route by them allocates
// nothing (the placing comes from a pool), and the order keeps the chain's
// steps in place while reordering a pool step's members.
func TestPlacementOrderAllocatesNothing(t *testing.T) {
	for _, policy := range []string{"sticky", "cache_aware", "least_busy"} {
		t.Run(policy, func(t *testing.T) { testPlacementAllocs(t, policy) })
	}
}

func testPlacementAllocs(t *testing.T, policy string) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
	}))
	defer srv.Close()
	h := provisionBench(t, `{
		"providers": [{"id": "p", "url": "`+srv.URL+`/v1"}],
		"upstreams": [{"id": "a", "provider": "p", "model": "x"}, {"id": "b", "provider": "p", "model": "x"},
			{"id": "c", "provider": "p", "model": "x"}, {"id": "d", "provider": "p", "model": "x"}],
		"pools": [{"id": "gpus", "upstreams": ["a", "b", "c"], "placement": "`+policy+`"}],
		"models": [{"name": "m", "upstreams": ["d", "gpus"]}]
	}`)
	rt := h.table.routes["m"]
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("X-Claude-Code-Session-Id", "s1")
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("be brief. ", 4000) + `"},{"role":"user","content":"hi"}]}`)
	in := &placeInput{r: r, body: body, codec: chatCodec{}, led: h.led, now: time.Now()}
	var first []int
	allocs := testing.AllocsPerRun(100, func() {
		pl := placeRequest(rt, in)
		o := rt.orderFor(pl)
		if first == nil {
			first = append([]int(nil), o...)
		} else if policy == "sticky" && (o[0] != first[0] || o[1] != first[1]) {
			t.Fatalf("order %v, then %v: one key, idle members, one order", first, o)
		}
		donePlacing(pl)
	})
	if allocs != 0 {
		t.Errorf("placement and order: %v allocations per request, want 0", allocs)
	}
	if len(first) != 4 || first[0] != 0 {
		t.Errorf("order %v: the directly named upstream d is the chain's first step and stays first", first)
	}
}
