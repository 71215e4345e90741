package transform

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestUsageScanner(t *testing.T) {
	cases := []struct {
		name    string
		pieces  []string
		want    Usage
		timings bool
	}{
		{"chat body", []string{`{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":2}}}`},
			Usage{Input: 12, Output: 5, CachedInput: 3, Reasoning: 2, Seen: true, CacheReported: true}, false},
		{"cached 0 is a report", []string{`{"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`},
			Usage{Input: 12, Output: 5, Seen: true, CacheReported: true}, false},
		{"chat stream split", []string{"data: {\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usa", "ge\":{\"prompt_tokens\":7,", "\"completion_tokens\":9}}\n\ndata: [DONE]\n\n"},
			Usage{Input: 7, Output: 9, Seen: true}, false},
		{"anthropic", []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n", "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n"},
			Usage{Input: 24, Output: 15, CachedInput: 4, Seen: true, CacheReported: true}, false},
		{"responses", []string{"data: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":6,\"input_tokens_details\":{\"cached_tokens\":1},\"output_tokens_details\":{\"reasoning_tokens\":4}}}}\n\n"},
			Usage{Input: 8, Output: 6, CachedInput: 1, Reasoning: 4, Seen: true, CacheReported: true}, false},
		{"llama.cpp timings", []string{"data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":3},\"tim", "ings\":{\"cache_n\":850,\"prompt_n\":50,\"predicted_n\":3}}\n\n"},
			Usage{Input: 900, Output: 3, CachedInput: 850, Seen: true, CacheReported: true}, true},
		{"timings not asked for", []string{`{"usage":{"prompt_tokens":900,"completion_tokens":3},"timings":{"cache_n":850,"prompt_n":50}}`},
			Usage{Input: 900, Output: 3, Seen: true}, false},
		{"gemini stream split", []string{
			"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hi\"}],\"role\":\"model\"},\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":1,\"totalTokenCount\":11}}\r\n\r\n",
			"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"!\"}],\"role\":\"model\"},\"finishReason\":\"STOP\",\"index\":0}],\"usageMeta",
			"data\":{\"promptTokenCount\":10,\"candidatesTokenCount\":5,\"totalTokenCount\":17,\"cachedContentTokenCount\":4,\"promptTokensDetails\":[{\"modality\":\"TEXT\",\"tokenCount\":10}],\"thoughtsTokenCount\":2}}\r\n\r\n"},
			Usage{Input: 10, Output: 7, CachedInput: 4, Reasoning: 2, Seen: true, CacheReported: true}, false},
		{"gemini key cut in the word", []string{`{"candidates":[],"usa`, `geMetadata":{"promptTokenCount":6,"candidatesTokenCount":2}}`},
			Usage{Input: 6, Output: 2, Seen: true}, false},
		{"gemini key cut after the quote", []string{`{"candidates":[],"`, `usageMetadata":{"promptTokenCount":6,"candidatesTokenCount":2}}`},
			Usage{Input: 6, Output: 2, Seen: true}, false},
		{"another usage member", []string{`{"usageStats":{"prompt_tokens":5},"usage":{"prompt_tokens":1,"completion_tokens":1}}`},
			Usage{Input: 1, Output: 1, Seen: true}, false},
		{"text mentioning usage", []string{`{"choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\":99}"}}]}`}, Usage{}, false},
	}
	for _, c := range cases {
		var s UsageScanner
		s.Timings = c.timings
		for _, p := range c.pieces {
			s.Write([]byte(p))
		}
		if s.Usage != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, s.Usage, c.want)
		}
	}
}

// benchStream is a 24-chunk chat stream with a final usage chunk, written
// one event per Write as the proxy's copy loop does.
func benchStream() [][]byte {
	var evs [][]byte
	for i := range 24 {
		evs = append(evs, []byte(`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{"content":"token `+string(rune('a'+i))+` of the answer "},"finish_reason":null}]}`+"\n\n"))
	}
	evs = append(evs, []byte(`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":{"prompt_tokens":312,"completion_tokens":86,"total_tokens":398,"prompt_tokens_details":{"cached_tokens":256}}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return evs
}

// BenchmarkUsageScanStream is the whole cost usage counting adds to one
// such stream (compare with the CPU per request of the load benchmark's
// stream scenarios).
func BenchmarkUsageScanStream(b *testing.B) {
	evs := benchStream()
	n := 0
	for _, e := range evs {
		n += len(e)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	var s UsageScanner
	for b.Loop() {
		s.Reset()
		for _, e := range evs {
			s.Write(e)
		}
	}
	if s.Output != 86 || s.CachedInput != 256 {
		b.Fatalf("usage %+v", s.Usage)
	}
}

// usageReference is the encoding/json reading the hand scanner replaced:
// the fuzz target checks they agree on every object json accepts.
func usageReference(obj []byte) (Usage, bool) {
	type cached struct {
		CachedTokens *int64 `json:"cached_tokens"`
	}
	type reasoning struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	}
	var u struct {
		PromptTokens            int64     `json:"prompt_tokens"`
		CompletionTokens        int64     `json:"completion_tokens"`
		InputTokens             int64     `json:"input_tokens"`
		OutputTokens            int64     `json:"output_tokens"`
		CacheReadInputTokens    *int64    `json:"cache_read_input_tokens"`
		CacheCreationTokens     *int64    `json:"cache_creation_input_tokens"`
		PromptTokensDetails     cached    `json:"prompt_tokens_details"`
		InputTokensDetails      cached    `json:"input_tokens_details"`
		CompletionTokensDetails reasoning `json:"completion_tokens_details"`
		OutputTokensDetails     reasoning `json:"output_tokens_details"`
	}
	d := json.NewDecoder(bytes.NewReader(obj))
	if d.Decode(&u) != nil {
		return Usage{}, false
	}
	var cacheRead int64
	if u.CacheReadInputTokens != nil || u.CacheCreationTokens != nil {
		// Anthropic's input_tokens leaves the cached prompt out.
		cacheRead = deref(u.CacheReadInputTokens)
		u.InputTokens += cacheRead + deref(u.CacheCreationTokens)
	}
	// A count given (a non-negative integer) is a report, 0 included.
	given := func(p *int64) bool { return p != nil && *p >= 0 }
	return Usage{
		Input:         max(u.PromptTokens, u.InputTokens),
		Output:        max(u.CompletionTokens, u.OutputTokens),
		CachedInput:   max(deref(u.PromptTokensDetails.CachedTokens), deref(u.InputTokensDetails.CachedTokens), cacheRead),
		Reasoning:     max(u.CompletionTokensDetails.ReasoningTokens, u.OutputTokensDetails.ReasoningTokens),
		Seen:          true,
		CacheReported: given(u.PromptTokensDetails.CachedTokens) || given(u.InputTokensDetails.CachedTokens) || given(u.CacheReadInputTokens),
	}, true
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func TestUsageObjectShapes(t *testing.T) {
	for _, obj := range []string{
		`{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}`,
		`{ "prompt_tokens" : 12 , "prompt_tokens_details" : { "cached_tokens" : 3 , "audio_tokens" : 0 } , "completion_tokens" : 5 }`,
		`{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":1,"service_tier":"standard","server_tool_use":{"web_search_requests":0}}`,
		`{"input_tokens":8,"input_tokens_details":{"cached_tokens":1},"output_tokens":6,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":14}`,
		`{"note":"a } and a { in a string","arr":[1,{"prompt_tokens":99}],"prompt_tokens":7,"flag":true,"none":null,"neg":-3,"f":1.5e3}`,
	} {
		want, _ := usageReference([]byte(obj))
		var s UsageScanner
		s.Write([]byte(`{"usage":` + obj + `}`))
		if s.Usage != want {
			t.Errorf("%s: got %+v, want %+v", obj, s.Usage, want)
		}
	}
}

func FuzzUsageObject(f *testing.F) {
	for _, seed := range []string{
		`{"prompt_tokens":12,"completion_tokens_details":{"reasoning_tokens":2}}`,
		`{"input_tokens":1,"x":[{"y":"}"}],"output_tokens":2}`,
		`{"cache_read_input_tokens":4, "s":"\"usage\""}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		// encoding/json also matches keys case-insensitively and through
		// escapes, which no upstream relies on: leave those out.
		if len(obj) == 0 || obj[0] != '{' || !json.Valid(obj) || bytes.ContainsAny(obj, "\\ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
			return
		}
		want, ok := usageReference(obj)
		if !ok {
			return // a count json cannot hold in an int64
		}
		var s UsageScanner
		s.read(obj)
		if got := s.Usage; got != want {
			t.Fatalf("%s: got %+v, want %+v", obj, got, want)
		}
	})
}
