package transform

import "testing"

func TestUsageScanner(t *testing.T) {
	cases := []struct {
		name   string
		pieces []string
		want   Usage
	}{
		{"chat body", []string{`{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":2}}}`},
			Usage{Input: 12, Output: 5, CachedInput: 3, Reasoning: 2, Seen: true}},
		{"chat stream split", []string{"data: {\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usa", "ge\":{\"prompt_tokens\":7,", "\"completion_tokens\":9}}\n\ndata: [DONE]\n\n"},
			Usage{Input: 7, Output: 9, Seen: true}},
		{"anthropic", []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n", "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n"},
			Usage{Input: 20, Output: 15, CachedInput: 4, Seen: true}},
		{"responses", []string{"data: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":6,\"input_tokens_details\":{\"cached_tokens\":1},\"output_tokens_details\":{\"reasoning_tokens\":4}}}}\n\n"},
			Usage{Input: 8, Output: 6, CachedInput: 1, Reasoning: 4, Seen: true}},
		{"text mentioning usage", []string{`{"choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\":99}"}}]}`}, Usage{}},
	}
	for _, c := range cases {
		var s UsageScanner
		for _, p := range c.pieces {
			s.Write([]byte(p))
		}
		if s.Usage != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, s.Usage, c.want)
		}
	}
}
