package transform

import "strconv"

// MaxTokens returns the request's output bound: the largest of its
// top-level max_tokens (chat, Messages, completions),
// max_completion_tokens (chat) and max_output_tokens (Responses) that is a
// positive integer, or 0 when it sets none. Budgets reserve by it (SPEC
// §16), so a request naming several takes the largest.
func MaxTokens(body []byte) int64 {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0
	}
	it := iterObject(body, i, false)
	var m member
	var best int64
	for it.next(&m) {
		if !keyIs(body, &m, "max_tokens") && !keyIs(body, &m, "max_completion_tokens") && !keyIs(body, &m, "max_output_tokens") {
			continue
		}
		n, err := strconv.ParseInt(string(body[m.vs:m.ve]), 10, 64)
		if err == nil && n > best {
			best = n
		}
	}
	return best
}
