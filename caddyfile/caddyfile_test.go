package caddyfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/llm-route/caddy-llm-route/llmroute"
)

// prov is the smallest valid provider block, for cases about other parts.
const prov = "\tprovider p {\n\t\turl https://api.example.com/v1\n\t}\n"

func parseString(input string) (*llmroute.Handler, error) {
	return unmarshalHandler(caddyfile.NewTestDispenser(input))
}

func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(s)); err != nil {
		t.Fatalf("bad expected JSON %s: %v", s, err)
	}
	return buf.String()
}

func TestParseValid(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  string
	}{
		{
			name:  "bare directive",
			input: `llm_route`,
			want:  `{}`,
		},
		{
			name:  "empty block",
			input: "llm_route {\n}",
			want:  `{}`,
		},
		{
			name: "minimal",
			input: `llm_route {
	provider openai {
		url https://api.openai.com/v1
		key {env.OPENAI_API_KEY}
	}
	upstream gpt4o openai gpt-4o
	model gpt gpt4o
}`,
			want: `{"providers":[{"id":"openai","url":"https://api.openai.com/v1","key":"{env.OPENAI_API_KEY}"}],
				"upstreams":[{"id":"gpt4o","provider":"openai","model":"gpt-4o"}],
				"models":[{"name":"gpt","upstreams":["gpt4o"]}]}`,
		},
		{
			name: "handler options",
			input: `llm_route {
	request_timeout PT5M
	max_request_body 32MiB
	queue_size 8
	queue_timeout 30s
	retry_after_max P1D
	heartbeat_interval PT0S
}`,
			want: `{"request_timeout":"5m","max_request_body":33554432,"queue_size":8,"queue_timeout":"30s",
				"retry_after_max":"24h","heartbeat_interval":"0s"}`,
		},
		{
			name:  "max_request_body decimal unit",
			input: "llm_route {\n\tmax_request_body 1MB\n}",
			want:  `{"max_request_body":1000000}`,
		},
		{
			name:  "max_request_body plain bytes",
			input: "llm_route {\n\tmax_request_body 1048576\n}",
			want:  `{"max_request_body":1048576}`,
		},
		{
			name:  "queue_size zero",
			input: "llm_route {\n\tqueue_size 0\n}",
			want:  `{}`,
		},
		{
			name: "provider, every setting",
			input: `llm_route {
	provider routerai {
		url https://routerai.ru/api/v1
		key "{file./run/secrets/routerai}"
		max_concurrency 4
		session_header x-opencode-session
		think_tags split
		reasoning_field reasoning_content
		reasoning_empty_ok
		backoff P1M
		first_byte_timeout PT30S
		stream_idle_timeout 1m30s
		probe_interval PT1S
		header HTTP-Referer https://example.com
		header X-Title "My app"
		patch {
			provider {
				allow_fallbacks false
			}
		}
	}
}`,
			want: `{"providers":[{"id":"routerai","url":"https://routerai.ru/api/v1","key":"{file./run/secrets/routerai}",
				"max_concurrency":4,"patch":{"provider":{"allow_fallbacks":false}},
				"headers":{"HTTP-Referer":"https://example.com","X-Title":"My app"},
				"session_header":"x-opencode-session","think_tags":"split","reasoning_field":"reasoning_content",
				"reasoning_empty_ok":true,"backoff":"720h","first_byte_timeout":"30s","stream_idle_timeout":"1m30s",
				"probe_interval":"1s"}]}`,
		},
		{
			name:  "empty key",
			input: "llm_route {\n\tprovider p {\n\t\turl http://10.0.0.5:8080/v1\n\t\tkey \"\"\n\t}\n}",
			want:  `{"providers":[{"id":"p","url":"http://10.0.0.5:8080/v1"}]}`,
		},
		{
			name:  "reasoning_empty_ok true",
			input: "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\treasoning_empty_ok true\n\t}\n}",
			want:  `{"providers":[{"id":"p","url":"http://x","reasoning_empty_ok":true}]}`,
		},
		{
			name:  "reasoning_empty_ok false",
			input: "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\treasoning_empty_ok false\n\t}\n}",
			want:  `{"providers":[{"id":"p","url":"http://x"}]}`,
		},
		{
			name: "think_tags words",
			input: `llm_route {
	provider a {
		url http://a
		think_tags true
	}
	provider b {
		url http://b
		think_tags false
	}
	provider c {
		url http://c
		think_tags STRIP
	}
	provider d {
		url http://d
		think_tags sometimes
	}
}`,
			want: `{"providers":[{"id":"a","url":"http://a","think_tags":"split"},{"id":"b","url":"http://b","think_tags":"off"},
				{"id":"c","url":"http://c","think_tags":"strip"},{"id":"d","url":"http://d","think_tags":"sometimes"}]}`,
		},
		{
			name: "upstream block, every setting",
			input: `llm_route {
` + prov + `	upstream routerai-gpt4o {
		provider p
		model gpt-4o
		max_concurrency 4
		think_tags off
		backoff PT15M
		first_byte_timeout 10s
		stream_idle_timeout 2m
		probe_interval PT0S
		patch {
			provider {
				ignore [ deepseek ]
			}
		}
	}
}`,
			want: `{"providers":[{"id":"p","url":"https://api.example.com/v1"}],
				"upstreams":[{"id":"routerai-gpt4o","provider":"p","model":"gpt-4o","max_concurrency":4,
				"patch":{"provider":{"ignore":["deepseek"]}},"think_tags":"off","backoff":"15m",
				"first_byte_timeout":"10s","stream_idle_timeout":"2m","probe_interval":"0s"}]}`,
		},
		{
			name: "upstream short form with a block",
			input: `llm_route {
` + prov + `	upstream u p qwen2.5-72b-instruct {
		max_concurrency 1
	}
}`,
			want: `{"providers":[{"id":"p","url":"https://api.example.com/v1"}],
				"upstreams":[{"id":"u","provider":"p","model":"qwen2.5-72b-instruct","max_concurrency":1}]}`,
		},
		{
			name: "definitions in any order",
			input: `llm_route {
	model m b a
	upstream a p x
	upstream b p y
` + prov + `}`,
			want: `{"providers":[{"id":"p","url":"https://api.example.com/v1"}],
				"upstreams":[{"id":"a","provider":"p","model":"x"},{"id":"b","provider":"p","model":"y"}],
				"models":[{"name":"m","upstreams":["b","a"]}]}`,
		},
		{
			name: "model block, upstreams repeated and appended",
			input: `llm_route {
` + prov + `	upstream a p x
	upstream b p y
	upstream c p z
	model m a {
		upstreams c
		upstreams b
		queue_size 0
		queue_timeout PT1M
		patch {
			reasoning {
				enabled false
			}
		}
	}
}`,
			want: `{"providers":[{"id":"p","url":"https://api.example.com/v1"}],
				"upstreams":[{"id":"a","provider":"p","model":"x"},{"id":"b","provider":"p","model":"y"},{"id":"c","provider":"p","model":"z"}],
				"models":[{"name":"m","upstreams":["a","c","b"],"patch":{"reasoning":{"enabled":false}},"queue_size":0,"queue_timeout":"1m"}]}`,
		},
		{
			name: "provider transport, parsed by reverse_proxy's http transport",
			input: `llm_route {
	provider p {
		url https://gpu.lan/v1
		transport http {
			tls_insecure_skip_verify
			dial_timeout 5s
			keepalive_idle_conns_per_host 8
		}
	}
	provider q {
		url https://q/v1
		transport http
	}
}`,
			want: `{"providers":[
				{"id":"p","url":"https://gpu.lan/v1","transport":{"dial_timeout":5000000000,"keep_alive":{"max_idle_conns_per_host":8},"protocol":"http","tls":{"insecure_skip_verify":true}}},
				{"id":"q","url":"https://q/v1","transport":{"protocol":"http"}}]}`,
		},
		{
			name: "model block only, several ids on one line",
			input: `llm_route {
` + prov + `	upstream a p x
	upstream b p y
	model m {
		upstreams b a
		queue_size 3
	}
}`,
			want: `{"providers":[{"id":"p","url":"https://api.example.com/v1"}],
				"upstreams":[{"id":"a","provider":"p","model":"x"},{"id":"b","provider":"p","model":"y"}],
				"models":[{"name":"m","upstreams":["b","a"],"queue_size":3}]}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseString(tc.input)
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			got, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			if want := compactJSON(t, tc.want); string(got) != want {
				t.Errorf("JSON mismatch\n got: %s\nwant: %s", got, want)
			}
		})
	}
}

// TestPatchForms covers the patch syntax; each input is the patch setting of
// one provider, and want is the resulting patch, key order included.
func TestPatchForms(t *testing.T) {
	for _, tc := range []struct {
		name  string
		patch string
		want  string
	}{
		{"JSON literal leaves", "patch {\n temperature 0.7\n max_tokens 1024\n offset -2\n scale 1e3\n allow_fallbacks false\n stream true\n stop null\n}",
			`{"temperature":0.7,"max_tokens":1024,"offset":-2,"scale":1e3,"allow_fallbacks":false,"stream":true,"stop":null}`},
		{"string leaves", "patch {\n effort high\n url https://x/y?a=b\n version 01\n plus +1\n word True\n dot .5\n}",
			`{"effort":"high","url":"https://x/y?a=b","version":"01","plus":"+1","word":"True","dot":".5"}`},
		{"double quotes make a string", "patch {\n a \"0.7\"\n b \"true\"\n c \"two words\"\n d \"\"\n e \"[\"\n}",
			`{"a":"0.7","b":"true","c":"two words","d":"","e":"["}`},
		{"backticks are raw JSON", "patch {\n model_name `\"true\"`\n stop `[\"\\n\\n\"]`\n meta `{\"a\": [1, {\"b\": null}]}`\n n `42`\n}",
			`{"model_name":"true","stop":["\n\n"],"meta":{"a":[1,{"b":null}]},"n":42}`},
		{"bare JSON words", "patch {\n stop [\"a\",\"b\"]\n obj {\"k\":1}\n s x\"y\n}",
			`{"stop":["a","b"],"obj":{"k":1},"s":"x\"y"}`},
		{"several values make an array", "patch {\n ignore deepseek openai\n mixed a 1 true \"2\"\n}",
			`{"ignore":["deepseek","openai"],"mixed":["a",1,true,"2"]}`},
		{"bracket arrays", "patch {\n one [ deepseek ]\n none [ ]\n nums [ 1 2.5 -3 ]\n nested [ [ a ] [ ] b ]\n pair [ a ] [ b ]\n}",
			`{"one":["deepseek"],"none":[],"nums":[1,2.5,-3],"nested":[["a"],[],"b"],"pair":[["a"],["b"]]}`},
		{"multi-line array", "patch {\n order [\n  deepseek\n  openai anthropic\n ]\n after 1\n}",
			`{"order":["deepseek","openai","anthropic"],"after":1}`},
		{"nested blocks", "patch {\n reasoning {\n  enabled false\n  effort low\n }\n provider {\n  sort {\n   by price\n  }\n }\n}",
			`{"reasoning":{"enabled":false,"effort":"low"},"provider":{"sort":{"by":"price"}}}`},
		{"empty nested block", "patch {\n extra {\n }\n}", `{"extra":{}}`},
		{"empty patch block", "patch {\n}", `{}`},
		{"key order as written", "patch {\n zeta 1\n alpha 2\n mid {\n  z 1\n  a 2\n }\n}",
			`{"zeta":1,"alpha":2,"mid":{"z":1,"a":2}}`},
		{"quoted keys", "patch {\n \"two words\" 1\n \"}\" 2\n}", `{"two words":1,"}":2}`},
		{"same key in different objects", "patch {\n a {\n  x 1\n }\n b {\n  x 2\n }\n x 3\n}",
			`{"a":{"x":1},"b":{"x":2},"x":3}`},
		{"raw JSON in backticks", "patch `{\"reasoning\":{\"enabled\":false}, \"b\": 1, \"a\": 2}`",
			`{"reasoning":{"enabled":false},"b":1,"a":2}`},
		{"raw JSON double-quoted", "patch \"{\\\"z\\\": 1, \\\"a\\\": 2}\"", `{"z":1,"a":2}`},
		{"raw JSON heredoc", "patch <<JSON\n  {\n    \"reasoning\": {\"enabled\": false},\n    \"temperature\": 0.2\n  }\n  JSON",
			`{"reasoning":{"enabled":false},"temperature":0.2}`},
		{"raw empty object", "patch `{}`", `{}`},
		{"integer at the exact limit", "patch {\n seed 9007199254740992\n}", `{"seed":9007199254740992}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			input := "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\t" + tc.patch + "\n\t}\n}"
			h, err := parseString(input)
			if err != nil {
				t.Fatalf("unexpected error: %v\ninput:\n%s", err, input)
			}
			if len(h.Providers) != 1 {
				t.Fatalf("want 1 provider, got %d", len(h.Providers))
			}
			if got := string(h.Providers[0].Patch); got != tc.want {
				t.Errorf("patch mismatch\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

// TestPatchEveryLevel checks that patch works the same in the three blocks.
func TestPatchEveryLevel(t *testing.T) {
	h, err := parseString(`llm_route {
	provider p {
		url http://x
		patch {
			a 1
		}
	}
	upstream u p m {
		patch {
			b 2
		}
	}
	model m u {
		patch ` + "`" + `{"c":3}` + "`" + `
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		string(h.Providers[0].Patch): `{"a":1}`,
		string(h.Upstreams[0].Patch): `{"b":2}`,
		string(h.Models[0].Patch):    `{"c":3}`,
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  string // substring of the error
		line  int
	}{
		// directive level
		{"argument after the directive", "llm_route foo {\n}", `unexpected argument "foo"`, 1},
		{"unknown subdirective", "llm_route {\n\tfoo bar\n}", `unrecognized llm_route subdirective "foo"`, 2},
		{"duplicate setting", "llm_route {\n\tqueue_size 1\n\tqueue_size 2\n}", "queue_size already specified at line 2", 3},
		{"bad duration", "llm_route {\n\trequest_timeout 5 minutes\n}", "request_timeout: want 1 argument, got 2", 2},
		{"bad duration word", "llm_route {\n\trequest_timeout soon\n}", `request_timeout: invalid duration "soon"`, 2},
		{"negative duration", "llm_route {\n\tqueue_timeout -1s\n}", "must not be negative", 2},
		{"ISO hour in date part", "llm_route {\n\tretry_after_max P1H\n}", `invalid duration "P1H"`, 2},
		{"missing duration", "llm_route {\n\theartbeat_interval\n}", "heartbeat_interval: want 1 argument, got 0", 2},
		{"bad size", "llm_route {\n\tmax_request_body lots\n}", `max_request_body: invalid size "lots"`, 2},
		{"zero size", "llm_route {\n\tmax_request_body 0\n}", "max_request_body: must be greater than 0", 2},
		{"huge size", "llm_route {\n\tmax_request_body 8EiB\n}", "too large", 2},
		{"bad int", "llm_route {\n\tqueue_size many\n}", `queue_size: "many" is not an integer`, 2},
		{"negative int", "llm_route {\n\tqueue_size -1\n}", "queue_size: must not be negative", 2},
		{"setting with a block", "llm_route {\n\tqueue_size 1 {\n\t}\n}", "queue_size: unexpected block", 2},

		// provider
		{"provider without id", "llm_route {\n\tprovider {\n\t\turl http://x\n\t}\n}", "provider: want an id", 2},
		{"provider with two ids", "llm_route {\n\tprovider a b {\n\t}\n}", `provider "a": unexpected argument "b"`, 2},
		{"provider empty id", "llm_route {\n\tprovider \"\" {\n\t}\n}", "provider id must not be empty", 2},
		{"duplicate provider", "llm_route {\n" + prov + "\tprovider p {\n\t\turl http://y\n\t}\n}", `duplicate provider "p" (first defined at line 2)`, 5},
		{"provider without url", "llm_route {\n\tprovider p {\n\t\tkey k\n\t}\n}", `provider "p": url is required`, 2},
		{"provider without block", "llm_route {\n\tprovider p\n}", `provider "p": url is required`, 2},
		{"unknown provider setting", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tmodel m\n\t}\n}", `provider "p": unrecognized subdirective "model"`, 4},
		{"url twice", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\turl http://y\n\t}\n}", `provider "p": url already specified at line 3`, 4},
		{"url without value", "llm_route {\n\tprovider p {\n\t\turl\n\t}\n}", `provider "p": url: want 1 argument, got 0`, 3},
		{"url with two values", "llm_route {\n\tprovider p {\n\t\turl http://x http://y\n\t}\n}", "url: want 1 argument, got 2", 3},
		{"bad max_concurrency", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tmax_concurrency 1.5\n\t}\n}", `max_concurrency: "1.5" is not an integer`, 4},
		{"negative max_concurrency", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tmax_concurrency -2\n\t}\n}", "max_concurrency: must not be negative, got -2", 4},
		{"bad backoff", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tbackoff PT1D\n\t}\n}", `provider "p": backoff: invalid duration "PT1D"`, 4},
		{"bad reasoning_empty_ok", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\treasoning_empty_ok maybe\n\t}\n}", `reasoning_empty_ok: want true or false, got "maybe"`, 4},
		{"think_tags twice", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tthink_tags split\n\t\tthink_tags off\n\t}\n}", "think_tags already specified at line 4", 5},
		{"header without value", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\theader X-Title\n\t}\n}", "header: want 2 arguments, got 1", 4},
		{"url without scheme", "llm_route {\n\tprovider p {\n\t\turl api.openai.com/v1\n\t}\n}", `provider "p": url: "api.openai.com/v1" must start with http:// or https://`, 3},
		{"url with another scheme", "llm_route {\n\tprovider p {\n\t\tkey k\n\t\turl ftp://x/v1\n\t}\n}", `provider "p": url: "ftp://x/v1" must start with http:// or https://`, 4},
		{"url without host", "llm_route {\n\tprovider p {\n\t\turl http:///v1\n\t}\n}", `provider "p": url: "http:///v1" has no host`, 3},
		{"url with query", "llm_route {\n\tprovider p {\n\t\turl http://x/v1?a=1\n\t}\n}", "must not have a query or fragment", 3},
		{"url credentials redacted", "llm_route {\n\tprovider p {\n\t\turl ftp://user:sk-secret@x/v1\n\t}\n}", `"ftp://redacted@x/v1" must start with`, 3},
		{"transport without name", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\ttransport\n\t}\n}", `provider "p": transport: want a transport name`, 4},
		{"unknown transport", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\ttransport carrier_pigeon\n\t}\n}", "http.reverse_proxy.transport.carrier_pigeon", 4},
		{"bad transport option", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\ttransport http {\n\t\t\tdial_timeout soon\n\t\t}\n\t}\n}", "soon", 5},
		{"transport twice", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\ttransport http\n\t\ttransport http\n\t}\n}", "transport already specified at line 4", 5},
		{"header twice", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\theader X-Title a\n\t\theader x-title b\n\t}\n}", `header "x-title" already specified at line 4`, 5},

		// upstream
		{"upstream without id", "llm_route {\n\tupstream\n}", "upstream: want an id", 2},
		{"upstream short form missing model", "llm_route {\n" + prov + "\tupstream u p\n}", `upstream "u": want ` + "`upstream <id> <provider> <model>`", 5},
		{"upstream short form extra argument", "llm_route {\n" + prov + "\tupstream u p m x\n}", `upstream "u": unexpected argument "x" after the model`, 5},
		{"upstream without provider", "llm_route {\n\tupstream u {\n\t\tmodel m\n\t}\n}", `upstream "u": provider and model are required`, 2},
		{"upstream alone", "llm_route {\n\tupstream u\n}", `upstream "u": provider and model are required`, 2},
		{"unknown provider short form", "llm_route {\n" + prov + "\tupstream u nope m\n}", `upstream "u": unknown provider "nope"`, 5},
		{"unknown provider in block", "llm_route {\n" + prov + "\tupstream u {\n\t\tmodel m\n\t\tprovider nope\n\t}\n}", `upstream "u": unknown provider "nope"`, 7},
		{"duplicate upstream", "llm_route {\n" + prov + "\tupstream u p a\n\tupstream u p b\n}", `duplicate upstream "u" (first defined at line 5)`, 6},
		{"provider in short form and block", "llm_route {\n" + prov + "\tupstream u p m {\n\t\tprovider p\n\t}\n}", `upstream "u": provider already specified at line 5`, 6},
		{"unknown upstream setting", "llm_route {\n" + prov + "\tupstream u p m {\n\t\tkey k\n\t}\n}", `upstream "u": unrecognized subdirective "key"`, 6},
		{"bad upstream duration", "llm_route {\n" + prov + "\tupstream u p m {\n\t\tprobe_interval 1x\n\t}\n}", `upstream "u": probe_interval: invalid duration "1x"`, 6},

		// model
		{"model without name", "llm_route {\n\tmodel\n}", "model: want a name", 2},
		{"model without upstreams", "llm_route {\n\tmodel m {\n\t\tqueue_size 1\n\t}\n}", `model "m": needs at least one upstream`, 2},
		{"model alone", "llm_route {\n\tmodel m\n}", `model "m": needs at least one upstream`, 2},
		{"unknown upstream", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel gpt u\n\tmodel other {\n\t\tupstreams u\n\t\tupstreams nope\n\t}\n}", `model "other": unknown upstream "nope"`, 9},
		{"upstream listed twice", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel gpt u {\n\t\tupstreams u\n\t}\n}", `model "gpt": upstream "u" listed twice (first at line 6)`, 7},
		{"empty upstreams line", "llm_route {\n\tmodel m {\n\t\tupstreams\n\t}\n}", `model "m": upstreams: want at least one upstream id`, 3},
		{"duplicate model", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel gpt u\n\tmodel gpt u\n}", `duplicate model "gpt" (first defined at line 6)`, 7},
		{"model queue_size bad", "llm_route {\n\tmodel m {\n\t\tqueue_size x\n\t}\n}", `model "m": queue_size: "x" is not an integer`, 3},
		{"unknown model setting", "llm_route {\n\tmodel m {\n\t\tmax_concurrency 1\n\t}\n}", `model "m": unrecognized subdirective "max_concurrency"`, 3},

		// router model
		{"rule without name", "llm_route {\n\tmodel auto {\n\t\trule {\n\t\t}\n\t}\n}", `model "auto": rule: want a name`, 3},
		{"duplicate rule", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel a u\n\tmodel auto {\n\t\trule r {\n\t\t\tuse a\n\t\t}\n\t\trule r {\n\t\t\tuse a\n\t\t}\n\t}\n}", `model "auto": rule "r": duplicate name (first at line 8)`, 11},
		{"rule without use", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tpriority 2\n\t\t}\n\t}\n}", `model "auto": rule "r": use: needs at least one model`, 5},
		{"rule setting twice", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tpriority 2\n\t\t\tpriority 3\n\t\t}\n\t}\n}", `model "auto": rule "r": priority already specified at line 4`, 5},
		{"rule unknown setting", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tupstreams u\n\t\t}\n\t}\n}", `model "auto": rule "r": unrecognized subdirective "upstreams"`, 4},
		{"match attribute twice", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tmatch team a\n\t\t\tmatch team b\n\t\t}\n\t}\n}", `model "auto": rule "r": match "team": already specified`, 5},
		{"match upper-case", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tmatch Team a\n\t\t}\n\t}\n}", `match "Team": attribute names are lower-case`, 4},
		{"match without value", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tmatch team\n\t\t}\n\t}\n}", `model "auto": rule "r": match: want at least 2 arguments, got 1`, 4},
		{"bad weight", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tweights 9 x\n\t\t}\n\t}\n}", `weights: "x" is not a non-negative integer`, 4},
		{"bad priority", "llm_route {\n\tmodel auto {\n\t\trule r {\n\t\t\tpriority high\n\t\t}\n\t}\n}", `priority: "high" is not an integer`, 4},
		{"unknown judge", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel a u\n\tmodel auto {\n\t\tjudge clf\n\t\trule r {\n\t\t\tuse a\n\t\t}\n\t}\n}", `model "auto": judge: unknown model "clf"`, 8},
		{"judge bad deadline", "llm_route {\n\tmodel auto {\n\t\tjudge clf soon\n\t}\n}", `model "auto": judge: deadline: invalid duration "soon"`, 3},
		{"judge on a plain model", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel a u {\n\t\tjudge a\n\t}\n}", `model "a": judge: only a router model (one with rules) has a judge`, 8},
		{"router model with a patch", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel a u\n\tmodel auto {\n\t\tpatch `{}`\n\t\trule r {\n\t\t\tuse a\n\t\t}\n\t}\n}", `model "auto": patch: a router model has none of its own`, 12},
		{"unknown shadow model", "llm_route {\n" + prov + "\tupstream u p m\n\tmodel a u\n\tmodel auto {\n\t\trule r {\n\t\t\tuse a\n\t\t\tshadow cand 0.5\n\t\t}\n\t}\n}", `model "auto": rule "r": shadow: unknown model "cand"`, 10},
		{"label upper-case", "llm_route {\n\tkey k {\n\t\tsecret s\n\t\tlabels {\n\t\t\tTeam a\n\t\t}\n\t}\n}", `key "k": labels: name "Team" must be lower-case`, 5},
		{"label twice", "llm_route {\n\tkey k {\n\t\tsecret s\n\t\tlabels {\n\t\t\tteam a\n\t\t\tteam b\n\t\t}\n\t}\n}", `key "k": labels: "team" already specified`, 6},

		// patch
		{"patch without value", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch\n\t}\n}", `provider "p": patch: want a block or one raw JSON object`, 4},
		{"patch twice", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `{}`\n\t\tpatch `{}`\n\t}\n}", "patch already specified at line 4", 5},
		{"raw patch not an object", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `[1]`\n\t}\n}", "patch: must be a JSON object", 4},
		{"raw patch invalid", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `{\"a\":}`\n\t}\n}", "patch: invalid character", 4},
		{"raw patch duplicate key", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `{\"a\":{\"b\":1,\"b\":2}}`\n\t}\n}", `patch: duplicate key "b"`, 4},
		{"raw patch two arguments", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `{}` `{}`\n\t}\n}", "patch: want one raw JSON object or a block, got more arguments", 4},
		{"raw patch and block", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `{}` {\n\t\t\ta 1\n\t\t}\n\t}\n}", "patch: want raw JSON or a block, not both", 4},
		{"key without value", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\treasoning\n\t\t}\n\t}\n}", `provider "p": patch.reasoning: missing value`, 5},
		{"duplicate key", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\ta 1\n\t\t\tb 2\n\t\t\ta 3\n\t\t}\n\t}\n}", `patch: duplicate key "a" (first at line 5)`, 7},
		{"duplicate nested key", "llm_route {\n\tmodel m {\n\t\tpatch {\n\t\t\tr {\n\t\t\t\tx 1\n\t\t\t\tx 2\n\t\t\t}\n\t\t}\n\t}\n}", `model "m": patch.r: duplicate key "x" (first at line 5)`, 6},
		{"values and block", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\tr a {\n\t\t\t\tx 1\n\t\t\t}\n\t\t}\n\t}\n}", "patch.r: want values or a block, not both", 5},
		{"unclosed bracket", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\tignore [ a b\n\t\t}\n\t}\n}", `patch.ignore: unexpected "}" inside the '[' of line 5`, 6},
		{"bracket at end of input", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\tignore [", "patch.ignore: '[' at line 5 is not closed", 5},
		{"stray closing bracket", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\tignore a ]\n\t\t}\n\t}\n}", `patch.ignore: unexpected "]"`, 5},
		{"bracket as key", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\t[ a ]\n\t\t}\n\t}\n}", `patch: unexpected "[" where a key was expected`, 5},
		{"bad raw value", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\tstop `[\"a\",]`\n\t\t}\n\t}\n}", "patch.stop: raw JSON: invalid character", 5},
		{"number out of range", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\tbig 1e400\n\t\t}\n\t}\n}", "patch.big: number 1e400 is out of range", 5},
		{"integer too large", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\tseed 9007199254740993\n\t\t}\n\t}\n}", "patch.seed: integer 9007199254740993 is too large", 5},
		{"patch nested too deep", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch {\n\t\t\ta " + strings.Repeat("[ ", 64) + "\n\t\t}\n\t}\n}", "nested more than 64 levels deep", 5},
		{"integer too large in raw JSON", "llm_route {\n\tprovider p {\n\t\turl http://x\n\t\tpatch `{\"seed\": -18446744073709551615}`\n\t}\n}", "integer -18446744073709551615 is too large", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseString(tc.input)
			if err == nil {
				b, _ := json.Marshal(h)
				t.Fatalf("want error containing %q, got none; JSON %s", tc.want, b)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not contain %q", msg, tc.want)
			}
			if at := fmt.Sprintf(", at Testfile:%d", tc.line); !strings.HasSuffix(msg, at) {
				t.Errorf("error %q does not end with %q", msg, at)
			}
		})
	}
}

func TestRegistered(t *testing.T) {
	// Registering twice panics; a registered directive appears in the
	// directive order before reverse_proxy.
	defer func() {
		if recover() == nil {
			t.Error("llm_route was not registered")
		}
	}()
	httpcaddyfile.RegisterDirective("llm_route", nil)
}

func TestQuoteOf(t *testing.T) {
	d := caddyfile.NewTestDispenser("a \"b\" `c` <<X\nd\nX\n\"\" ``")
	var got []rune
	for d.Next() {
		got = append(got, quoteOf(d))
	}
	want := []rune{0, '"', '`', '<', '"', '`'}
	if string(got) != string(want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
