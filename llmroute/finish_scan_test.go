package llmroute

import "testing"

// finishScanner finds a non-empty finish_reason member wherever the stream
// is split, and is not fooled by a null or empty one or by the words inside
// a string.
func TestFinishScanner(t *testing.T) {
	cases := []struct {
		name, stream string
		want         bool
	}{
		{"stop", `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n", true},
		{"spaced", `data: {"choices":[{"index":0,"delta":{},"finish_reason" :  "length"}]}` + "\n\n", true},
		{"null", `data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}` + "\n\n", false},
		{"empty", `data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":""}]}` + "\n\n", false},
		{"in content", `data: {"choices":[{"index":0,"delta":{"content":"say \"finish_reason\":\"stop\""},"finish_reason":null}]}` + "\n\n", false},
		{"in arguments", `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"finish_reason\": \"x\"}"}}]},"finish_reason":null}]}` + "\n\n", false},
		{"later event", `data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}` + "\n\n" +
			`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\n", true},
	}
	for _, c := range cases {
		for cut1 := 0; cut1 <= len(c.stream); cut1++ {
			for _, cut2 := range []int{cut1, min(cut1+1, len(c.stream)), min(cut1+9, len(c.stream))} {
				var f finishScanner
				f.scan([]byte(c.stream[:cut1]))
				f.scan([]byte(c.stream[cut1:cut2]))
				f.scan([]byte(c.stream[cut2:]))
				if f.seen != c.want {
					t.Fatalf("%s split at %d, %d: seen %v, want %v", c.name, cut1, cut2, f.seen, c.want)
				}
			}
		}
	}
}
