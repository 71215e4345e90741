package gemini

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// randomID matches the ids made up for an answer without them.
var randomID = regexp.MustCompile(`"call_[a-z0-9]{24}"|"responseId":"[0-9a-f]{16}"`)

func fromChat(t *testing.T, chat string, info *Info) string {
	t.Helper()
	out, err := FromChat(nil, []byte(chat), info)
	if err != nil {
		t.Fatalf("FromChat(%s): %v", chat, err)
	}
	if !json.Valid(out) {
		t.Fatalf("FromChat(%s) = invalid %s", chat, out)
	}
	return string(out)
}

const chatHead = `{"id":"chatcmpl-123","object":"chat.completion","model":"real-model","choices":[{"index":0,"message":`

// Every row of the answer table, byte for byte.
func TestFromChatTable(t *testing.T) {
	think := &Info{Model: "asked", IncludeThoughts: true}
	plain := &Info{Model: "asked"}
	for _, tc := range []struct {
		name, chat string
		info       *Info
		want       string
	}{
		{"thought, text, call; usage with cache and reasoning",
			chatHead + `{"role":"assistant","reasoning_content":"The user wants the weather.","content":"Let me check.","tool_calls":[{"id":"call_w1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},"finish_reason":"tool_calls"}],` +
				`"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`,
			think,
			`{"candidates":[{"content":{"role":"model","parts":[{"text":"The user wants the weather.","thought":true},{"text":"Let me check."},{"functionCall":{"id":"call_w1","name":"get_weather","args":{"city":"Paris"}}}]},"finishReason":"STOP","index":0}],` +
				`"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":3,"totalTokenCount":15,"cachedContentTokenCount":4,"thoughtsTokenCount":2},"modelVersion":"real-model","responseId":"chatcmpl-123"}`},
		{"reasoning without includeThoughts is left out; DeepSeek cache hits",
			chatHead + `{"role":"assistant","reasoning":"hmm","content":"A"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"prompt_cache_hit_tokens":3}}`,
			plain,
			`{"candidates":[{"content":{"role":"model","parts":[{"text":"A"}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":7,"totalTokenCount":16,"cachedContentTokenCount":3},"modelVersion":"real-model","responseId":"chatcmpl-123"}`},
		{"nothing at all: one empty text part; no usage, no usageMetadata; requested model",
			`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":null}]}`,
			plain,
			`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"modelVersion":"asked","responseId":"x"}`},
		{"length → MAX_TOKENS, cut arguments become {}",
			chatHead + `{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\": \"unfin"}}]},"finish_reason":"length"}]}`,
			plain,
			`{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"id":"c","name":"f","args":{}}}]},"finishReason":"MAX_TOKENS","index":0}],"modelVersion":"real-model","responseId":"chatcmpl-123"}`},
		{"arguments not an object: the call is left out, MALFORMED_FUNCTION_CALL",
			chatHead + `{"role":"assistant","content":"x","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"[1]"}},{"id":"d","type":"function","function":{"name":"g","arguments":""}}]},"finish_reason":"tool_calls"}]}`,
			plain,
			`{"candidates":[{"content":{"role":"model","parts":[{"text":"x"},{"functionCall":{"id":"d","name":"g","args":{}}}]},"finishReason":"MALFORMED_FUNCTION_CALL","index":0}],"modelVersion":"real-model","responseId":"chatcmpl-123"}`},
		{"content_filter → SAFETY, refusal as text",
			chatHead + `{"role":"assistant","content":null,"refusal":"no"},"finish_reason":"content_filter"}]}`,
			plain,
			`{"candidates":[{"content":{"role":"model","parts":[{"text":"no"}]},"finishReason":"SAFETY","index":0}],"modelVersion":"real-model","responseId":"chatcmpl-123"}`},
		{"other finish → OTHER; content parts; arguments object compacted",
			chatHead + `{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"tool_calls":[{"id":"c","function":{"name":"f","arguments":{"k": [1, 2]}}}]},"finish_reason":"weird"}]}`,
			plain,
			`{"candidates":[{"content":{"role":"model","parts":[{"text":"ab"},{"functionCall":{"id":"c","name":"f","args":{"k":[1,2]}}}]},"finishReason":"OTHER","index":0}],"modelVersion":"real-model","responseId":"chatcmpl-123"}`},
		{"U+2028 and U+2029 escaped, raw escapes kept",
			chatHead + `{"role":"assistant","content":"a` + "\u2028" + `b` + "\u2029" + `c\u2028\n"},"finish_reason":"stop"}]}`,
			plain,
			`{"candidates":[{"content":{"role":"model","parts":[{"text":"a\u2028b\u2029c\u2028\n"}]},"finishReason":"STOP","index":0}],"modelVersion":"real-model","responseId":"chatcmpl-123"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromChat(t, tc.chat, tc.info); got != tc.want {
				t.Errorf("FromChat\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

// Ids the upstream did not give are made up: call_ + 24 [a-z0-9], a 16-hex
// responseId.
func TestFromChatMadeUpIDs(t *testing.T) {
	got := fromChat(t, `{"choices":[{"message":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`, &Info{Model: "m"})
	if n := len(randomID.FindAllString(got, -1)); n != 2 {
		t.Fatalf("%d made-up ids in %s", n, got)
	}
	if again := fromChat(t, `{"choices":[{"message":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}`, &Info{}); again[:60] == got[:60] && randomID.FindString(again) == randomID.FindString(got) {
		t.Error("two answers got the same made-up id")
	}
}

func TestFromChatRefused(t *testing.T) {
	for _, chat := range []string{`not json`, `[1]`, `{"error":{"message":"x"}}`, `{"id":"x"}`} {
		if out, err := FromChat([]byte("keep"), []byte(chat), &Info{}); err == nil || string(out) != "keep" {
			t.Errorf("FromChat(%s) = %s, %v; want an error and dst untouched", chat, out, err)
		}
	}
}

func TestErrors(t *testing.T) {
	for status, name := range map[int]string{400: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED",
		403: "PERMISSION_DENIED", 404: "NOT_FOUND", 405: "UNIMPLEMENTED", 501: "UNIMPLEMENTED", 409: "ABORTED", 429: "RESOURCE_EXHAUSTED",
		499: "CANCELLED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED", 418: "FAILED_PRECONDITION", 599: "INTERNAL"} {
		if got := StatusName(status); got != name {
			t.Errorf("StatusName(%d) = %s, want %s", status, got, name)
		}
	}
	for _, tc := range []struct {
		got  []byte
		want string
	}{
		{ErrorBody(503, "all_upstreams_busy", "all upstreams busy", 1),
			`{"error":{"code":503,"message":"all upstreams busy","status":"UNAVAILABLE","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"all_upstreams_busy","domain":"llm_route"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1s"}]}}`},
		{ErrorBody(404, "", "model \"x\u2028\" not found", 0), `{"error":{"code":404,"message":"model \"x\u2028\" not found","status":"NOT_FOUND"}}`},
		{ErrorBody(429, "", "slow down", 30), `{"error":{"code":429,"message":"slow down","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}`},
		{AppendErrorEvent([]byte("x"), 503, "stream_interrupted", "the upstream stream was interrupted before it finished"),
			"x" + `data: {"error":{"code":503,"message":"the upstream stream was interrupted before it finished","status":"UNAVAILABLE","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"stream_interrupted","domain":"llm_route"}]}}` + "\r\n\r\n"},
		{TranslateError(400, []byte(`{"error":{"message":"context too long","type":"invalid_request_error","code":"context_length_exceeded"}}`)),
			`{"error":{"code":400,"message":"context too long","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"context_length_exceeded","domain":"llm_route"}]}}`},
		{TranslateError(429, []byte(`{"error":{"message":"rate","type":"rate_limit_error"}}`)),
			`{"error":{"code":429,"message":"rate","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"rate_limit_error","domain":"llm_route"}]}}`},
		{TranslateError(502, []byte(`Bad Gateway`)), `{"error":{"code":502,"message":"Bad Gateway","status":"UNAVAILABLE"}}`},
		{TranslateError(500, []byte(`{"error":"boom"}`)), `{"error":{"code":500,"message":"boom","status":"INTERNAL"}}`},
		{TranslateError(500, nil), `{"error":{"code":500,"message":"upstream error (HTTP 500)","status":"INTERNAL"}}`},
	} {
		if string(tc.got) != tc.want {
			t.Errorf("\n got %s\nwant %s", tc.got, tc.want)
		}
	}
	long := TranslateError(500, []byte(`{"error":{"message":"`+strings.Repeat("x", 3000)+`"}}`))
	if len(long) > maxErrorText+200 || !json.Valid(long) {
		t.Errorf("a long upstream message is not cut: %d bytes", len(long))
	}
}

func TestCountAndModels(t *testing.T) {
	n, err := CountTokensEstimate([]byte(`{"contents":[{"role":"user","parts":[{"text":"12345678"},{"inlineData":{"mimeType":"image/png","data":"` + strings.Repeat("A", 4000) + `"}}]},` +
		`{"role":"model","parts":[{"text":"1234","thoughtSignature":"` + strings.Repeat("B", 400) + `"}]}],"systemInstruction":{"parts":[{"text":"abcd"}]},"tools":[{"functionDeclarations":[{"name":"f"}]}]}`))
	// Strings: roles "user" 4 and "model" 5, texts 8 + 4, system 4, tool
	// name 1 = 26 bytes → 7 tokens; 2 contents × 4; one image 258 (its data
	// and the thought signature not counted).
	if err != nil || n != 7+8+258 {
		t.Errorf("CountTokensEstimate = %d, %v; want %d", n, err, 7+8+258)
	}
	n, err = CountTokensEstimate([]byte(`{"generateContentRequest":{"model":"models/x","contents":[{"parts":[{"text":"abcdefgh"}]}]}}`))
	if err != nil || n != 2+4 {
		t.Errorf("CountTokensEstimate(generateContentRequest) = %d, %v; want 6", n, err)
	}
	if _, err := CountTokensEstimate([]byte(`{"contents":`)); err == nil {
		t.Error("invalid JSON estimated")
	}
	if got := string(CountTokensBody(42)); got != `{"totalTokens":42}` {
		t.Errorf("CountTokensBody = %s", got)
	}
	const m = `{"name":"models/m","baseModelId":"m","version":"llm_route","displayName":"m","supportedGenerationMethods":["generateContent","streamGenerateContent","countTokens"]}`
	if got := string(ModelBody("m")); got != m {
		t.Errorf("ModelBody = %s", got)
	}
	mt := strings.NewReplacer(`models/m"`, `models/t"`, `"m"`, `"t"`).Replace(m)
	if got := string(ModelsBody([]string{"m", "t"})); got != `{"models":[`+m+`,`+mt+`]}` {
		t.Errorf("ModelsBody = %s", got)
	}
	if got := string(ModelsBody(nil)); got != `{"models":[]}` {
		t.Errorf("ModelsBody(nil) = %s", got)
	}
}
