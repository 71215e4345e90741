package caddyfile

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llm-route/caddy-llm-route/llmroute"
)

// FuzzCaddyfile feeds arbitrary text to the directive parser. It must never
// panic or hang; an error must carry a file:line; a success must marshal to
// JSON that survives Caddy's generic round trip and unmarshals back into the
// same handler, with every patch a JSON object.
func FuzzCaddyfile(f *testing.F) {
	for _, seed := range []string{
		"llm_route",
		"llm_route {\n}",
		"llm_route {\n\tprovider p {\n\t\turl http://x\n\t}\n\tupstream u p m\n\tmodel gpt u\n}",
		"llm_route {\n\trequest_timeout PT5M\n\tmax_request_body 32MiB\n\tqueue_size 2\n\tqueue_timeout 30s\n\tretry_after_max P1D\n\theartbeat_interval 15s\n}",
		"llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tkey {env.K}\n\t\tmax_concurrency 4\n\t\tsession_header x-s\n\t\tthink_tags split\n\t\treasoning_field reasoning_content\n\t\treasoning_empty_ok\n\t\tbackoff P1M\n\t\tfirst_byte_timeout PT30S\n\t\tstream_idle_timeout 1m\n\t\tprobe_interval PT0S\n\t\theader X-Title app\n\t}\n}",
		"llm_route {\n\tupstream u p m {\n\t\tmax_concurrency 1\n\t\tthink_tags strip\n\t\tbackoff PT15M\n\t}\n\tmodel m u {\n\t\tupstreams v w\n\t\tqueue_size 0\n\t\tqueue_timeout PT1M\n\t}\n}",
		"llm_route {\n\tmodel m u {\n\t\tpatch {\n\t\t\ttemperature 0.7\n\t\t\tallow false\n\t\t\teffort high\n\t\t\ts \"true\"\n\t\t\tb `\"true\"`\n\t\t\tstop `[\"\\n\"]`\n\t\t\tprovider {\n\t\t\t\tignore deepseek openai\n\t\t\t\torder [ a ]\n\t\t\t\tonly [ ]\n\t\t\t\tm [\n\t\t\t\t\tx [ y ]\n\t\t\t\t]\n\t\t\t}\n\t\t}\n\t}\n}",
		"llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch <<JSON\n\t\t{\"a\": {\"b\": [1, 2.5e3, null]}}\n\t\tJSON\n\t}\n}",
		"llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `{\"reasoning\":{\"enabled\":false}}`\n\t}\n}",
		"llm_route {\n\tprovider p {\n\t\tpatch {\n\t\t\ta [ { ] }\n\t\t}\n\t}\n}",
		"llm_route {\n\tprovider p {\n\t\tpatch {\n\t\t\ta 1 } b\n\t\t}\n\t}\n}",
		"llm_route { provider p { url x } }",
		"llm_route {\n\tupstream u p m\n\tmodel a u\n\tmodel auto {\n\t\tjudge a 250ms\n\t\trule r {\n\t\t\tpriority 3\n\t\t\teffort high\n\t\t\tmatch team x y\n\t\t\tuse a\n\t\t\tweights 1\n\t\t\tshadow a 0.5\n\t\t}\n\t}\n\tkey k {\n\t\tsecret s\n\t\tlabels {\n\t\t\tteam x\n\t\t}\n\t}\n}",
		"}\n{\n}\n{",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input string) {
		tokens, err := caddyfile.Tokenize([]byte(input), "Fuzzfile")
		if err != nil {
			return // the lexer's own errors are not ours
		}
		h, err := unmarshalHandler(caddyfile.NewDispenser(tokens))
		if err != nil {
			if len(tokens) > 0 && !strings.Contains(err.Error(), ", at Fuzzfile:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		out, err := json.Marshal(h)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var patches []json.RawMessage
		for _, p := range h.Providers {
			patches = append(patches, p.Patch)
		}
		for _, u := range h.Upstreams {
			patches = append(patches, u.Patch)
		}
		for _, m := range h.Models {
			patches = append(patches, m.Patch)
		}
		for _, p := range patches {
			if p == nil {
				continue
			}
			if !json.Valid(p) || bytes.TrimSpace(p)[0] != '{' {
				t.Fatalf("patch is not a JSON object: %s", p)
			}
			if err := checkJSON(p); err != nil {
				t.Fatalf("patch %s: %v", p, err)
			}
		}
		// What Caddy does to adapted config: decode into generic values and
		// encode again. It must not fail, and the handler must load from it.
		var generic any
		if err := json.Unmarshal(out, &generic); err != nil {
			t.Fatalf("generic decode of %s: %v", out, err)
		}
		if _, err := json.Marshal(generic); err != nil {
			t.Fatalf("generic encode: %v", err)
		}
		var back llmroute.Handler
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("unmarshal %s: %v", out, err)
		}
		again, err := json.Marshal(&back)
		if err != nil {
			t.Fatalf("marshal again: %v", err)
		}
		if !bytes.Equal(out, again) {
			t.Fatalf("JSON round trip changed the handler\nfirst:  %s\nsecond: %s", out, again)
		}
	})
}
