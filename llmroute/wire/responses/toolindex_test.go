package responses

import (
	"strings"
	"testing"
)

// Tool-call deltas without an index: each call's first delta carries its
// id, and a new id is a new call; a delta without id or index continues the
// last call. Indexed deltas that reuse an index for a new id start a new
// call too.
func TestStreamToolCallsWithoutIndex(t *testing.T) {
	chunk := func(calls string) string {
		return `data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"tool_calls":` + calls + `}}]}` + "\n\n"
	}
	end := chatChunk(`{}`, "tool_calls") + "data: [DONE]\n\n"
	cases := []struct{ name, up string }{
		{"first delta with id, then arguments",
			chunk(`[{"id":"call_a","type":"function","function":{"name":"read","arguments":""}}]`) +
				chunk(`[{"function":{"arguments":"{\"path\":"}}]`) + chunk(`[{"function":{"arguments":"\"a\"}"}}]`) +
				chunk(`[{"id":"call_b","type":"function","function":{"name":"grep","arguments":""}}]`) +
				chunk(`[{"function":{"arguments":"{\"path\":\"b\"}"}}]`) + end},
		{"whole calls, two in one chunk",
			chunk(`[{"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}},{"id":"call_b","type":"function","function":{"name":"grep","arguments":"{\"path\":\"b\"}"}}]`) + end},
		{"every call at index 0",
			chunk(`[{"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}}]`) +
				chunk(`[{"index":0,"id":"call_b","type":"function","function":{"name":"grep","arguments":""}}]`) +
				chunk(`[{"index":0,"function":{"arguments":"{\"path\":\"b\"}"}}]`) + end},
	}
	info := infoFor(t, `{"model":"m","input":"x","tools":[{"type":"function","name":"read","parameters":{}},{"type":"function","name":"grep","parameters":{}}]}`)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			evs := parseEvents(t, run(t, info, c.up, func() int { return 1 }))
			var got []string
			for _, e := range evs {
				if e.name != "response.output_item.done" {
					continue
				}
				item := e.data["item"].(map[string]any)
				got = append(got, item["call_id"].(string)+" "+item["name"].(string)+" "+item["arguments"].(string))
			}
			want := []string{`call_a read {"path":"a"}`, `call_b grep {"path":"b"}`}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("function calls\n got %q\nwant %q", got, want)
			}
		})
	}
}
