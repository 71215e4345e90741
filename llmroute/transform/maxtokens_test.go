package transform

import "testing"

func TestMaxTokens(t *testing.T) {
	for body, want := range map[string]int64{
		`{"model":"m","max_tokens":256}`:                              256,
		`{"max_completion_tokens":100,"messages":[{"max_tokens":9}]}`: 100, // top level only
		`{"max_output_tokens":50}`:                                    50,
		`{"max_tokens":10,"max_completion_tokens":20}`:                20,
		`{"max_tokens":null}`:                                         0,
		`{"max_tokens":"100"}`:                                        0,
		`{"max_tokens":-5}`:                                           0,
		`{"max_tokens":1.5}`:                                          0,
		`{"model":"m"}`:                                               0,
		`[1,2]`:                                                       0,
		`{"max_\u0074okens":7}`:                                       7,
	} {
		if got := MaxTokens([]byte(body)); got != want {
			t.Errorf("MaxTokens(%s) = %d, want %d", body, got, want)
		}
	}
}
