package llmroute

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// FuzzJSONConfig feeds arbitrary JSON to the handler config the way Caddy
// decodes it (unknown fields are errors), then validates and compiles it as
// Provision does. Properties: no panic; a config that decodes re-encodes to
// JSON that decodes to the same config (so `caddy adapt` output is stable).
func FuzzJSONConfig(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		`{"providers":[{"id":"p","url":"http://127.0.0.1:1/v1","key":"{env.K}","max_concurrency":2,"patch":{"a":{"b":1}},"backoff":"P1M","think_tags":true}],` +
			`"upstreams":[{"id":"u","provider":"p","model":"m","patch":{"a":[1]},"first_byte_timeout":"PT0.5S","think_tags":"strip"}],` +
			`"models":[{"name":"x","upstreams":["u"],"patch":{"a":null},"queue_size":0,"queue_timeout":1000}],"request_timeout":"5m","queue_size":3}`,
		`{"providers":[{"id":"p","url":"ftp://x"}],"upstreams":[{"id":"u","provider":"q","model":""}],"models":[{"name":"x","upstreams":["u","u"]}]}`,
		`{"providers":[{"id":"p","url":"http://h","headers":{"Authorization":"x","X-T":"{env.A}"},"session_header":"bad header"}]}`,
		`{"providers":[{"id":"p","url":"http://h","patch":[1]}]}`,
		`{"models":[{"name":"m","upstreams":[]}],"max_request_body":-1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, ok := decodeStrict(data)
		if !ok {
			return
		}
		again, err := json.Marshal(h)
		if err != nil {
			t.Fatalf("re-encoding a decoded config: %v", err)
		}
		h2, ok := decodeStrict(again)
		if !ok {
			t.Fatalf("re-encoded config does not decode: %s", again)
		}
		third, _ := json.Marshal(h2)
		if !bytes.Equal(again, third) {
			t.Fatalf("round trip changed the config:\n%s\n%s", again, third)
		}
		if validateConfig(h.Providers, h.Upstreams, h.Pools, h.Models) != nil {
			return
		}
		h.logger = zap.NewNop()
		h.metrics = getMetrics() // compileRoute binds the per-target counters
		repl := caddy.NewReplacer()
		providers := make(map[string]*Provider)
		conns := make(map[string]*providerConn)
		for i := range h.Providers {
			p := &h.Providers[i]
			p.TransportRaw = nil // loading a module needs a running config
			conn, err := h.connectProvider(caddy.Context{}, p, repl)
			if err != nil {
				return // Provision stops here too
			}
			providers[p.ID], conns[p.ID] = p, conn
		}
		h.table.upstreams = make(map[string]*upstream)
		for _, uc := range h.Upstreams {
			p := providers[uc.Provider]
			u, err := h.compileUpstream(uc, p, conns[p.ID], nil)
			if err != nil {
				return // Provision stops here too
			}
			h.table.upstreams[u.ID] = u
		}
		for _, m := range h.Models {
			if _, err := h.compileRoute(m); err != nil {
				return
			}
		}
	})
}

func decodeStrict(data []byte) (*Handler, bool) {
	var h Handler
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return nil, false
	}
	return &h, true
}
