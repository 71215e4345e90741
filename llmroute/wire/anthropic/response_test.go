package anthropic

import (
	"strings"
	"testing"
	"time"
)

func TestFromChat(t *testing.T) {
	const usage = `"usage":{"input_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3}`
	for _, tc := range []struct {
		name, chat, want string
	}{
		{"text, stop",
			`{"id":"chatcmpl-A1","object":"chat.completion","model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","refusal":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`,
			`{"id":"msg_A1","type":"message","role":"assistant","model":"gpt-x","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,` + usage + `}`},
		{"reasoning_content, length, cache reads",
			`{"id":"c","model":"deepseek","choices":[{"message":{"role":"assistant","content":"Part","reasoning_content":"Think \"hard\""},"finish_reason":"length"}],"usage":{"prompt_tokens":1000,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":800}}}`,
			`{"id":"msg_c","type":"message","role":"assistant","model":"deepseek","content":[{"type":"thinking","thinking":"Think \"hard\"","signature":""},{"type":"text","text":"Part"}],"stop_reason":"max_tokens","stop_sequence":null,` +
				`"usage":{"input_tokens":200,"cache_creation_input_tokens":0,"cache_read_input_tokens":800,"output_tokens":50}}`},
		{"reasoning (OpenRouter/vLLM name), no model: requested one",
			`{"id":"c","choices":[{"message":{"content":"A","reasoning":"R"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}`,
			`{"id":"msg_c","type":"message","role":"assistant","model":"asked","content":[{"type":"thinking","thinking":"R","signature":""},{"type":"text","text":"A"}],"stop_reason":"end_turn","stop_sequence":null,` + usage + `}`},
		{"tool calls, finish stop (llama.cpp style), bad arguments",
			`{"id":"c","model":"m","choices":[{"message":{"content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}},{"type":"function","function":{"name":"g","arguments":"{\"cut"}}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}`,
			`{"id":"msg_c","type":"message","role":"assistant","model":"m","content":[{"type":"tool_use","id":"call_1","name":"f","input":{"x":1}},{"type":"tool_use","id":"toolu_RANDOM","name":"g","input":{}}],"stop_reason":"tool_use","stop_sequence":null,` + usage + `}`},
		{"content_filter: refusal",
			`{"id":"c","model":"m","choices":[{"message":{"content":null,"refusal":"I can't."},"finish_reason":"content_filter"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}`,
			`{"id":"msg_c","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"I can't."}],"stop_reason":"refusal","stop_sequence":null,` + usage + `}`},
		{"content parts, no usage",
			`{"id":"c","model":"m","choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},"finish_reason":"stop"}]}`,
			`{"id":"msg_c","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ab"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromChat(nil, []byte(tc.chat), &Info{Model: "asked"})
			if err != nil {
				t.Fatal(err)
			}
			g := string(got)
			if i := strings.Index(g, `"toolu_`); i >= 0 { // random id: 24 hex digits
				g = g[:i] + `"toolu_RANDOM"` + g[i+len(`"toolu_`)+24+1:]
			}
			if g != tc.want {
				t.Errorf("\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
	for _, bad := range []string{`{`, `[]`, `{"error":{"message":"x"}}`, `{"id":"x"}`} {
		if out, err := FromChat([]byte("keep"), []byte(bad), &Info{}); err == nil || string(out) != "keep" {
			t.Errorf("FromChat(%s) = %s, %v", bad, out, err)
		}
	}
	// No chat id: a random msg_ id.
	got, _ := FromChat(nil, []byte(`{"choices":[{"message":{"content":"a"}}]}`), &Info{})
	if !strings.HasPrefix(string(got), `{"id":"msg_`) || len(got) < len(`{"id":"msg_`)+24 {
		t.Errorf("id: %s", got)
	}
}

func TestErrors(t *testing.T) {
	for status, typ := range map[int]string{
		400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
		429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
		504: "timeout_error", 529: "overloaded_error",
	} {
		if got := ErrorType(status); got != typ {
			t.Errorf("ErrorType(%d) = %s, want %s", status, got, typ)
		}
	}
	if got := string(ErrorBody(400, "unsupported_parameter", `bad "x"`)); got != `{"type":"error","error":{"type":"invalid_request_error","message":"bad \"x\"","code":"unsupported_parameter"}}` {
		t.Errorf("ErrorBody: %s", got)
	}
	if got := string(ErrorBody(503, "", "all upstreams busy")); got != `{"type":"error","error":{"type":"overloaded_error","message":"all upstreams busy"}}` {
		t.Errorf("ErrorBody: %s", got)
	}
	for _, tc := range []struct {
		status     int
		body, want string
	}{
		{400, `{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
			`{"type":"error","error":{"type":"invalid_request_error","message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}`},
		{429, `{"error":{"message":"Rate limit","code":429}}`, `{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit"}}`},
		{500, `{"error":"boom"}`, `{"type":"error","error":{"type":"api_error","message":"boom"}}`},
		{404, `{"message":"model not found","object":"error"}`, `{"type":"error","error":{"type":"not_found_error","message":"model not found"}}`},
		{502, "<html>Bad Gateway</html>\n", `{"type":"error","error":{"type":"api_error","message":"<html>Bad Gateway</html>"}}`},
		{503, ``, `{"type":"error","error":{"type":"overloaded_error","message":"upstream error (HTTP 503)"}}`},
		{500, `{"detail":"x"}`, `{"type":"error","error":{"type":"api_error","message":"upstream error (HTTP 500)"}}`},
	} {
		if got := string(TranslateError(tc.status, []byte(tc.body))); got != tc.want {
			t.Errorf("TranslateError(%d, %s)\n got: %s\nwant: %s", tc.status, tc.body, got, tc.want)
		}
	}
	long := strings.Repeat("é", 2000)
	got := TranslateError(500, []byte(long))
	if len(got) > maxErrorText+200 || !strings.HasSuffix(string(got), `…"}}`) {
		t.Errorf("long body: %d bytes: %.80s…", len(got), got)
	}
}

func TestModelsBody(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.FixedZone("x", 3600))
	got := string(ModelsBody([]string{"local-coder", "big"}, at))
	want := `{"data":[{"type":"model","id":"local-coder","display_name":"local-coder","created_at":"2026-12-01T09:00:00Z"},` +
		`{"type":"model","id":"big","display_name":"big","created_at":"2026-12-01T09:00:00Z"}],"has_more":false,"first_id":"local-coder","last_id":"big"}`
	if got != want {
		t.Errorf("\n got: %s\nwant: %s", got, want)
	}
	if got := string(ModelsBody(nil, at)); got != `{"data":[],"has_more":false,"first_id":null,"last_id":null}` {
		t.Errorf("empty: %s", got)
	}
}

func TestCountTokensEstimate(t *testing.T) {
	for _, tc := range []struct {
		body string
		want int
	}{
		// 4 per message + ceil(bytes/4): "hello world!" is 12 bytes.
		{`{"model":"m","messages":[{"role":"user","content":"hello world!"}]}`, 4 + (4+12+3)/4},
		// Billing block not counted; "text" and "abcd" are 8 bytes.
		{`{"system":[{"type":"text","text":"x-anthropic-billing-header: cc"},{"type":"text","text":"abcd"}],"messages":[]}`, 2},
		// An image counts 1600 whatever its data.
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.Repeat("A", 4000) + `"}}]}]}`, 4 + 1600 + 1},
		// Tools count their strings.
		{`{"messages":[],"tools":[{"name":"abcdefgh","input_schema":{"type":"object"}}]}`, (8 + 6 + 3) / 4},
		{`nope`, 0},
	} {
		if got := CountTokensEstimate([]byte(tc.body)); got != tc.want {
			t.Errorf("CountTokensEstimate(%.80s) = %d, want %d", tc.body, got, tc.want)
		}
	}
	if got := string(CountTokensBody(42)); got != `{"input_tokens":42}` {
		t.Errorf("CountTokensBody: %s", got)
	}
	// The recorded request lands in the right order of magnitude of its
	// text (the sample's long texts are elided, so it is small).
	body := readSample(t, "claude-code-turn1.json")
	if n := CountTokensEstimate(body); n < len(body)/12 || n > len(body)/3 {
		t.Errorf("sample estimate %d for %d bytes", n, len(body))
	}
}
