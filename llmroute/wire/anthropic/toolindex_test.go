package anthropic

import (
	"encoding/json"
	"strings"
	"testing"
)

// toolUses collects the tool_use blocks of a translated stream: id, name
// and the input JSON assembled from its input_json_delta events.
func toolUses(t *testing.T, out string) (ids, names, inputs []string) {
	t.Helper()
	byIndex := map[int]int{}
	for _, line := range strings.Split(out, "\n") {
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type         string
			Index        int
			ContentBlock struct{ Type, ID, Name string } `json:"content_block"`
			Delta        struct {
				Type        string
				PartialJSON string `json:"partial_json"`
			}
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatalf("event %q: %v", d, err)
		}
		switch {
		case ev.Type == "content_block_start" && ev.ContentBlock.Type == "tool_use":
			byIndex[ev.Index] = len(ids)
			ids = append(ids, ev.ContentBlock.ID)
			names = append(names, ev.ContentBlock.Name)
			inputs = append(inputs, "")
		case ev.Type == "content_block_delta" && ev.Delta.Type == "input_json_delta":
			i, ok := byIndex[ev.Index]
			if !ok {
				t.Fatalf("input_json_delta for block %d, which is no tool_use", ev.Index)
			}
			inputs[i] += ev.Delta.PartialJSON
		}
	}
	return ids, names, inputs
}

// Tool-call deltas without an index: each call's first delta carries its
// id, and a new id is a new call; a delta without id or index continues the
// last call. Indexed deltas that reuse an index for a new id start a new
// call too.
func TestStreamToolCallsWithoutIndex(t *testing.T) {
	cases := []struct {
		name   string
		chunks []string
	}{
		{"first delta with id, then arguments", []string{
			`{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","type":"function","function":{"name":"read","arguments":""}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"{\"path\":"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"\"a\"}"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_b","type":"function","function":{"name":"grep","arguments":""}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"{\"path\":\"b\"}"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		}},
		{"whole calls, two in one chunk", []string{
			`{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}},{"id":"call_b","type":"function","function":{"name":"grep","arguments":"{\"path\":\"b\"}"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		}},
		{"every call at index 0", []string{
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_b","type":"function","function":{"name":"grep","arguments":""}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":\"b\"}"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		}},
		{"id repeated on every delta", []string{
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"path\":"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_a","function":{"arguments":"\"a\"}"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_b","type":"function","function":{"name":"grep","arguments":"{\"path\":\"b\"}"}}]}}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := run(t, sse(c.chunks...)+"data: [DONE]\n\n", bytewise)
			ids, names, inputs := toolUses(t, out)
			if strings.Join(ids, ",") != "call_a,call_b" || strings.Join(names, ",") != "read,grep" ||
				len(inputs) != 2 || inputs[0] != `{"path":"a"}` || inputs[1] != `{"path":"b"}` {
				t.Fatalf("tool_use blocks ids %q names %q inputs %q\n%s", ids, names, inputs, out)
			}
			if !strings.Contains(out, `"stop_reason":"tool_use"`) {
				t.Errorf("stop_reason:\n%s", out)
			}
		})
	}
}
